# The two commands a fresh machine needs:
#   make demo   set up .venv, then run the main job (a local 2-process CPU training run)
#   make test   set up .venv, then run the whole test suite (what CI runs)

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.megdet-installed
DEMO_OUT ?= output/demo
# pytest keeps the temporary folders of its last 3 sessions; the training tests' checkpoints make
# one session's 2.8 GB. Keep only the failed tests' folders (what is worth reading).
PYTEST := $(BIN)/python -m pytest -o tmp_path_retention_policy=failed

.PHONY: policy setup demo test test-quick lint format bench clean help dashboards crd overrides generate doc-tables \
	messages image image-check cluster cluster-images cluster-down cluster-build node-packages \
	suite-deps suite-cluster suite-images packages-then-images test-previous-apiserver test-real-pods lint-tools

help:
	@echo "make demo   - set up, then train a small detector on 2 CPU workers"
	@echo "make test   - set up, then run the whole test suite"
	@echo "make test-quick - the suite without the real-cluster (e2e) tests"
	@echo "make test-real-pods - only the real-pod modules on the real node (make test runs them too)"
	@echo "make test-previous-apiserver - the CRD on the older kube-apiserver (its own build)"
	@echo "make cluster - build (first time) and start a real local control plane in .cluster/ (kwok nodes + one real node), with the images make image / make suite-images built loaded into the real node"
	@echo "make cluster-images - load the images built since into the running cluster's real node (IMAGES=train-ci: only that variant)"
	@echo "make cluster-down - stop it and delete .cluster/"
	@echo "make lint   - ruff check and format check"
	@echo "make bench  - run the benchmarks under bench/"
	@echo "make dashboards - regenerate the Grafana dashboards and alert rules from monitoring/"
	@echo "make crd   - regenerate the MegDetRun CRD from charts/megdet's values schema"
	@echo "make overrides - regenerate the chart's list of detectron2 keys that values own"
	@echo "make messages - regenerate the run chart's rule message templates from megdet/messages.py"
	@echo "make doc-tables - rewrite the docs' tables made from megdet/run_values.py and megdet/api/fields.py"
	@echo "make generate - all generated files (overrides, messages, CRD, dashboards, policy, doc tables), in dependency order"
	@echo "make image - build the training and controller images from package registries only"
	@echo "make image-check - compile detectron2's C++/CUDA ops at the pinned commit (no Docker)"

setup: $(STAMP)

# Re-run the install whenever the pin list or the installer changes. pip installs uv (pinned),
# uv the project: the same versions pip resolves, but uv links the files from its cache
# (~/.cache/uv) instead of unpacking 6 GB of wheels (torch's CUDA libraries) into every new
# .venv. --compile-bytecode writes the .pyc files as pip does: without them every process
# compiles sympy and torch._dynamo again where PYTHONDONTWRITEBYTECODE is set, 6 s more per
# import of detectron2 (measured; docs/benchmarks.md, "The .venv by uv"). pip stays in the
# .venv (tests build a wheel with it).
UV_VERSION := 0.13.8
$(STAMP): pyproject.toml scripts/install_detectron2_cpu.py imagebuild/detectron2_install.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24" "uv==$(UV_VERSION)"
	$(BIN)/uv pip install --python $(BIN)/python --quiet --compile-bytecode -e ".[train,controller,dev]"
	$(BIN)/python scripts/install_detectron2_cpu.py
	touch $(STAMP)

# Debian's prometheus + promtool, unpacked into the venv (no root needed) for the monitoring tests.
PROMETHEUS := $(VENV)/prometheus/usr/bin/prometheus
$(PROMETHEUS): pyproject.toml scripts/install_prometheus.py | $(STAMP)
	$(BIN)/python scripts/install_prometheus.py
	touch $(PROMETHEUS)

demo: setup
	$(BIN)/megdet demo --output $(DEMO_OUT)

# Three pytest-xdist workers on CI's two cores (PYTEST_WORKERS=0: all in one process). Every test
# of the real cluster is in one xdist group (tests/e2e/conftest.py): one worker runs those in
# order, on the session's control plane and the machine's one real node (every real-pod test:
# docs/cluster.md, "What make test runs on the node"), while the others run the rest. That
# worker waits on pods and the API server much of the time, and a third worker fills those
# waits: the same commit took 30.0 min with 2 workers and 29.4 with 3, both cores then 94 % busy
# (docs/benchmarks.md, "Workers").
PYTEST_WORKERS ?= 3
test: suite-deps $(PROMETHEUS)
	$(BIN)/ruff check .
	$(PYTEST) -n $(PYTEST_WORKERS) --dist loadgroup -m "not previous_apiserver" --durations=25

# What the e2e tests run, built before pytest starts (a first build takes far longer than one
# test's 900 s timeout; each step is a no-op once built): the control plane with the real node's
# binaries (not the older API server: test-previous-apiserver), the controller image and the
# e2e variant of the training image, which real pods on the real node run (imagebuild.build,
# docs/image.md; archives kept in ~/.cache/megdet/image, so a fresh clone of a built commit
# builds nothing).
# The Go builds use the CPUs, the image builds and the .venv install mostly wait on downloads
# and disk: all at once, with the lint tools (two small Go builds for tests/chart). The two
# builders are host tools that need only Python's standard library, so they run with $(PYTHON)
# and do not wait for the .venv (docs/contributing.md). The Debian packages go before the
# images only: the image builder installs podman with apt-get too, and a second `apt-get
# update` while one runs fails on apt's lock instead of waiting for it.
SUITE_COMPONENTS := kubernetes etcd kwok helm training_operator coredns jobset trainer kueue
suite-deps:
	$(MAKE) --no-print-directory -j4 --output-sync=line setup suite-cluster \
		packages-then-images lint-tools

packages-then-images: node-packages
	$(MAKE) --no-print-directory suite-images

suite-cluster:
	$(PYTHON) -m cluster.build $(SUITE_COMPONENTS)

suite-images:
	$(PYTHON) -m imagebuild.build controller train-ci

# The real-pod modules (marked real_pods), without the rest of make test (which runs them too;
# docs/cluster.md, "What make test runs on the node"): after a change to the Dockerfile, the
# charts' pod templates, the launcher or the trainer's signal handling. The run chart's helm install, the
# controller as a pod, the stamp, a bad image, the TrainJob, a Worker SIGKILLed then deleted
# (tests/e2e/test_e2e_real_training.py), and one MegDetRun watched from its creation, resized
# 2 -> 1 -> 2 GPUs while it trains and preempted by Kueue (tests/e2e/test_e2e_shared_run.py).
test-real-pods: suite-deps
	$(PYTEST) -m real_pods tests/e2e

# The MegDetRun CRD on the older kube-apiserver (kubernetes_previous, pinned in pyproject.toml):
# a second Kubernetes build of about 20 minutes on 2 cores, for a CRD that changes rarely; run it
# when charts/megdet-operator/crds/ changes (docs/cluster.md, "Which tests run against what").
test-previous-apiserver: setup
	$(BIN)/python -m cluster.build kubernetes_previous
	$(PYTEST) -m previous_apiserver tests/e2e

# kube-score and kubeconform (pinned in pyproject.toml, built from the Go module proxy into
# ~/.cache/megdet/cluster/bin; a no-op once built) for tests/chart/test_chart_lint.py, which lints
# both charts' renders and the pods their jobs create (docs/helm.md, "Linting what the
# controller creates").
lint-tools:
	$(PYTHON) -m cluster.build kube_score kubeconform

# The suite without tests/e2e (no control plane needed): the inner loop.
test-quick: setup $(PROMETHEUS) lint-tools
	$(BIN)/ruff check .
	$(PYTEST) --ignore=tests/e2e

# A real Kubernetes control plane on this machine (cluster; docs/cluster.md). The first
# run builds the pinned binaries from the Go module proxy into ~/.cache/megdet/cluster. The images
# `make image` and `make suite-images` left in output/images go into the real node's containerd
# (README.md, "Try it locally"); `make cluster-images` loads those built later.
cluster: setup node-packages
	$(BIN)/python -m cluster up

IMAGES ?=
cluster-images: setup
	$(BIN)/python -m cluster load-images $(IMAGES)

# The real node's Debian packages (containerd, runc, CNI plugins, iptables, busybox-static, gcc):
# installed as root when missing, a note naming them otherwise (docs/cluster.md, "The real node").
node-packages:
	scripts/install_node_packages.sh

cluster-down: setup
	$(BIN)/python -m cluster down

# Only build the control plane's binaries (all of them: also Trainer v2, JobSet, Kueue and the
# older kube-apiserver the CRD is installed on too).
cluster-build: setup
	$(BIN)/python -m cluster.build --all

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Regenerate the committed Grafana dashboards and PrometheusRule template from monitoring/.
dashboards: setup
	$(BIN)/python -m megdet.monitoring generate

# The training and controller images from the Dockerfile with Debian's podman, from package
# registries only (imagebuild.build; docs/image.md): OCI archives in output/images/, cached by
# their inputs' digest. Installs podman/buildah/mmdebstrap/runc from Debian when missing (root).
# DETECTRON2_SRC=/path/to/detectron2.git compiles detectron2's ops from that source.
image: setup
	$(BIN)/python -m imagebuild.build controller train

# The image's riskiest step without Docker: compile detectron2's extension (C++ and CUDA ops)
# at the pinned commit against the venv's torch, in a folder under /tmp (docs/image.md).
# DETECTRON2_SRC=/path/to/detectron2 uses a source tree instead of cloning; MAX_JOBS=N.
image-check: setup
	$(BIN)/python scripts/image_check.py

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build output .pytest_cache .ruff_cache .hypothesis .cluster

# The MegDetRun CRD is generated from charts/megdet/values.schema.json and values.yaml
# (tests/api/test_crd.py fails when the committed copy is stale).
crd: setup
	$(BIN)/python -m megdet.api.crd

# The detectron2 override keys that named values own (megdet/overrides.py), as the run chart reads
# them (tests/chart fails when charts/megdet/files/owned-overrides.yaml is stale).
OVERRIDES_FILE := charts/megdet/files/owned-overrides.yaml
overrides: setup
	$(BIN)/python -m megdet.overrides > $(OVERRIDES_FILE).tmp
	mv $(OVERRIDES_FILE).tmp $(OVERRIDES_FILE)

# The run chart's message templates (megdet/messages.py, the one copy of each rule's message)
# (tests/chart/test_chart_messages.py fails when charts/megdet/templates/_messages.tpl is stale).
MESSAGES_FILE := charts/megdet/templates/_messages.tpl
messages: setup
	$(BIN)/python -m megdet.messages > $(MESSAGES_FILE).tmp
	mv $(MESSAGES_FILE).tmp $(MESSAGES_FILE)

# The operator chart's admission policy validations, generated from the rules' CEL
# (megdet/policy/rules.py, megdet/policy/knobs.py)
# (tests/controller/test_policy.py fails when the committed copy is stale).
POLICY_FILE := charts/megdet-operator/files/policy-validations.yaml
policy: setup
	$(BIN)/python -m megdet.api.admission > $(POLICY_FILE).tmp
	mv $(POLICY_FILE).tmp $(POLICY_FILE)

# The docs' tables made from one source, rewritten between their markers
# (megdet/api/docs_tables.py): docs/helm.md's run values (megdet/run_values.py) and
# docs/operations.md's spec fields (megdet/api/fields.py)
# (tests/api/test_docs_tables.py fails when one is stale).
doc-tables: setup
	$(BIN)/python -m megdet.api.docs_tables

# Every generated file, in dependency order: the CRD's CEL rules read the owned-overrides list.
generate: overrides messages crd dashboards policy doc-tables
