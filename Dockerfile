# syntax=docker/dockerfile:1
#
# Two images from one file (see docs/image.md):
#   docker build -t megdet:0.1.0 .                                  training image (CUDA)
#   docker build --target controller -t megdet-controller:0.1.0 .  controller (no torch, no CUDA)
#   make image      the same stages from package registries only (imagebuild.build: a Debian
#                   base made by mmdebstrap, torch's CUDA wheels from PyPI; the args below)
#
# Every version below defaults to the project's pin list in pyproject.toml
# ([project.optional-dependencies] and [tool.megdet]); tests/image checks that they agree.

# CUDA 12.6: torch 2.14's legacy build, its only one with Volta (V100) kernels. PyPI's default
# is a CUDA 13 build and CUDA 13 dropped Volta; the cu128 builds dropped it in torch 2.11.
ARG CUDA_VERSION=12.6.3
ARG TORCH_CUDA_TAG=cu126
# The stages' base images. `make image` passes a local Debian base for all three.
ARG BUILD_BASE=nvidia/cuda:12.6.3-devel-ubuntu24.04
ARG RUNTIME_BASE=nvidia/cuda:12.6.3-runtime-ubuntu24.04
ARG CONTROLLER_BASE=python:3.12-slim-bookworm
# The base's Python: its apt package (also -dev and -venv) and interpreter name.
ARG PYTHON=python3.12
# Where torch and torchvision come from: PyTorch's index for TORCH_CUDA_TAG, or PyPI (whose
# torch is a CUDA 13.0 build that brings the CUDA runtime, cuDNN and NCCL as nvidia-* wheels).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1
# detectron2: `git` fetches DETECTRON2_REPO (a URL or a path mounted into the build) at the
# commit and compiles its ops; `pypi` installs the pinned PyPI wheel's Python code without
# them (no registry serves detectron2's C++/CUDA sources; docs/image.md).
ARG DETECTRON2_SOURCE=git
ARG DETECTRON2_REPO=https://github.com/facebookresearch/detectron2
ARG DETECTRON2_COMMIT=02b5c4e295e990042a714712c21dc79b731e8833
# V100 (7.0), A100 (8.0), H100 (9.0), plus PTX for newer GPUs to JIT-compile. Empty: C++ ops only.
ARG TORCH_CUDA_ARCH_LIST="7.0;8.0;9.0+PTX"
# Image metadata (OCI labels); pass --build-arg VCS_REF=$(git rev-parse HEAD) etc.
ARG VERSION=0.1.0
ARG VCS_REF=unknown
ARG SOURCE_URL=unknown

# ---------------------------------------------------------------------------------------------
# build: compile detectron2's CUDA ops against the pinned torch and fill a venv at /opt/venv.
# The devel flavour without cuDNN: detectron2's ops do not use it, and torch's wheel brings its own.
FROM ${BUILD_BASE} AS build
ARG PYTHON
ARG TORCH_INDEX_URL
ARG TORCH_VERSION
ARG TORCHVISION_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

# The base image fixes the distribution release and with it the package series; the archives
# drop superseded versions, so apt pins would break the build within weeks.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        build-essential "${PYTHON}" "${PYTHON}-dev" "${PYTHON}-venv" git ca-certificates ninja-build \
    && rm -rf /var/lib/apt/lists/*

RUN "${PYTHON}" -m venv /opt/venv \
    && pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"

# The rest of the training pins, read from pyproject.toml (never retyped here). torch and
# torchvision are constrained to the builds above so pip fails rather than swap in others.
COPY pyproject.toml /src/pyproject.toml
COPY imagebuild/pins.py imagebuild/detectron2_install.py /src/
RUN python /src/pins.py /src/pyproject.toml train --exclude torch torchvision \
        > /tmp/requirements.txt \
    && printf 'torch==%s\ntorchvision==%s\n' "${TORCH_VERSION}" "${TORCHVISION_VERSION}" \
        > /tmp/constraints.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt -c /tmp/constraints.txt

# Declared here, not at the top of the stage, so that builds which differ only in their
# detectron2 share the cached layers above (the torch install).
ARG DETECTRON2_SOURCE
ARG DETECTRON2_REPO
ARG DETECTRON2_COMMIT
ARG TORCH_CUDA_ARCH_LIST
# Parallel nvcc jobs; each can take several GB of RAM.
ARG MAX_JOBS=8
# detectron2 (imagebuild/detectron2_install.py). git: the pinned commit, verified, with its ops
# compiled for TORCH_CUDA_ARCH_LIST (FORCE_CUDA: no GPU is visible during a build; nvcc from
# the base image, else NVIDIA's PyPI wheels pinned in pyproject.toml), checked by importing
# detectron2._C. --no-deps: its setup.py caps iopath below our pin; its runtime deps are above.
RUN python /src/detectron2_install.py --pyproject /src/pyproject.toml \
        --source "${DETECTRON2_SOURCE}" --repo "${DETECTRON2_REPO}" \
        --commit "${DETECTRON2_COMMIT}" --archs "${TORCH_CUDA_ARCH_LIST}" --jobs "${MAX_JOBS}"

# ---------------------------------------------------------------------------------------------
# controller: the MegDetRun operator. Python only: no torch, no CUDA.
FROM ${CONTROLLER_BASE} AS controller
ARG VERSION
ARG VCS_REF
ARG SOURCE_URL
LABEL org.opencontainers.image.title="megdet-controller" \
      org.opencontainers.image.description="MegDetRun operator for MegDet training on Kubernetes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
# jemalloc: the controller's memory allocator (ENV below).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libjemalloc2 \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
# The base dependencies and the [controller] extra (kopf, the Kubernetes client, ...) at their
# pinned versions, read from pyproject.toml, in a venv (the python image's interpreter, or
# Debian's with python3-venv: the same step on both bases); then the project in a layer of its
# own, so a change to the code does not download the dependencies again.
COPY pyproject.toml imagebuild/pins.py /src/
RUN python3 -m venv /opt/venv \
    && python3 /src/pins.py /src/pyproject.toml controller > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm -rf /src /tmp/requirements.txt \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin megdet
COPY . /src
RUN pip install --no-cache-dir --no-deps /src \
    && rm -rf /src \
    && megdet --version
# The run chart: the controller renders each MegDetRun's job with it, in process (one job builder).
COPY charts/megdet /opt/megdet/charts/megdet
ENV MEGDET_CHART_DIR=/opt/megdet/charts/megdet
# The controller's memory allocator: jemalloc, for every allocation (PYTHONMALLOC=malloc sends
# Python's small objects to it too, not to pymalloc's arenas, which a burst of runs leaves
# pinned by a few survivors). The heap trimmer purges its arenas once a burst is over: after
# 1,000 runs were deleted the RSS came back to 1.14x ready against 1.23-1.24x with pymalloc, at
# the same CPU per run (docs/benchmarks.md). The operator chart's controller.allocator sets
# these again, or turns them off (pymalloc).
ENV LD_PRELOAD=libjemalloc.so.2 \
    PYTHONMALLOC=malloc
USER 10001:10001
ENTRYPOINT ["megdet"]
# `megdet controller`: the MegDetRun operator (docs/operations.md).
CMD ["controller"]

# ---------------------------------------------------------------------------------------------
# train (the default target): the CUDA runtime, Python and the venv from the build stage.
# No cuDNN flavour: torch's wheel carries its own cuDNN (and NCCL), a second copy would be dead
# weight. The runtime flavour provides libcudart for detectron2's compiled ops.
FROM ${RUNTIME_BASE} AS train
ARG PYTHON
ARG VERSION
ARG VCS_REF
ARG SOURCE_URL
LABEL org.opencontainers.image.title="megdet" \
      org.opencontainers.image.description="MegDet-style large-batch detectron2 training" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/home/megdet

# Same reason as in the build stage: the base image pins the package series. The package
# lists and apt's two binary caches of them (78 MB in the Debian base made here) are removed.
# libibverbs1 + ibverbs-providers (rdma-core's user space; the names in Ubuntu 24.04 and
# Debian 12): NCCL dlopens
# libibverbs.so.1, which loads the HCA's provider (libmlx5-rdmav*.so); without them NCCL's
# InfiniBand transport finds no device and falls back to TCP sockets. `megdet doctor` checks.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends "${PYTHON}" tini libibverbs1 ibverbs-providers \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin megdet \
    && mkdir -p /data /output \
    && chown 10001:10001 /output

COPY --from=build /opt/venv /opt/venv
# The project itself, in a layer of its own after the venv's (several GB: torch), so a change
# to the code rebuilds only this small one. Its dependencies are in the venv from the same
# pins, and so is its build backend (setuptools, pinned): no build isolation, no download.
# The whole context: .dockerignore keeps it to pyproject.toml, README.md and the packages.
COPY . /src
RUN pip install --no-cache-dir --no-deps --no-build-isolation /src \
    && rm -rf /src \
    && python -c "import torch, detectron2; print('torch', torch.__version__, 'CUDA', torch.version.cuda)" \
    && megdet --version
USER 10001:10001
WORKDIR /output
# tini is PID 1: it reaps zombies and passes SIGTERM to `megdet launch`, which passes it to
# torchrun and so to every trainer process (they checkpoint before the pod dies).
ENTRYPOINT ["/usr/bin/tini", "--", "megdet", "launch"]
CMD ["train", "--config", "megdet_R50_FPN_1x.yaml"]
