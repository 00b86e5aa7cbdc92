# syntax=docker/dockerfile:1
#
# Two images from one file (see docs/image.md):
#   docker build -t megdet:0.1.0 .                                  training image (CUDA)
#   docker build --target controller -t megdet-controller:0.1.0 .  controller (no torch, no CUDA)
#   make image      the same stages and arguments with Debian's podman, on a Debian 12 base made
#                   here by mmdebstrap instead of the registry's (imagebuild.build)
#
# The defaults are what `make image` builds and the e2e tests run: Debian 12, its Python, PyPI's
# torch (a CUDA 13.0 build), detectron2's Python code from PyPI. Other recipes (detectron2's
# CUDA ops, CUDA 12.6 for V100s) are sets of --build-arg: pyproject.toml
# [tool.megdet.image.arg_sets], the table in docs/image.md. Versions default to the project's
# pins in pyproject.toml; tests/image checks that they agree.

# The stages' base images: Debian 12 from the registry (the same minbase package set that
# `make image` bootstraps; docs/image.md says what differs). `make image` passes its own base.
ARG BUILD_BASE=docker.io/library/debian:bookworm
ARG RUNTIME_BASE=docker.io/library/debian:bookworm
ARG CONTROLLER_BASE=docker.io/library/debian:bookworm
# The training stages' Python: its apt package (also -dev and -venv) and interpreter name.
ARG PYTHON=python3.11
# Where torch and torchvision come from: PyPI, whose torch is a CUDA 13.0 build that brings the
# CUDA runtime, cuDNN and NCCL as nvidia-* wheels (no CUDA base image needed), or PyTorch's
# index for another CUDA (an arg set).
ARG TORCH_INDEX_URL=https://pypi.org/simple
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1
# detectron2: `git` fetches DETECTRON2_REPO (a URL or a path mounted into the build) at the
# commit and compiles its ops; `pypi` installs the pinned PyPI wheel's Python code without
# them (no registry serves detectron2's C++/CUDA sources; docs/image.md).
ARG DETECTRON2_SOURCE=pypi
ARG DETECTRON2_REPO=https://github.com/facebookresearch/detectron2
ARG DETECTRON2_COMMIT=02b5c4e295e990042a714712c21dc79b731e8833
# With DETECTRON2_SOURCE=git: the GPUs its CUDA ops are compiled for, the archs PyPI's torch has
# kernels for (T4 7.5, A100 8.0, H100 9.0, B200 10.0, RTX 50xx 12.0; 8.6/8.9 run the 8.0 code),
# plus PTX for newer GPUs to JIT-compile. Empty: the C++ ops only.
ARG TORCH_CUDA_ARCH_LIST="7.5;8.0;9.0;10.0;12.0+PTX"
# Image metadata (OCI labels); pass --build-arg VCS_REF=$(git rev-parse HEAD) etc.
ARG VERSION=0.1.0
ARG VCS_REF=unknown
ARG SOURCE_URL=unknown
# What the installed package's README says: pyproject.toml names README.md as its readme, and
# .dockerignore keeps the real one out of the context so that a README edit rebuilds nothing.
ARG README_STUB="megdet: MegDet-style large-batch detectron2 training (README.md in the source)"

# ---------------------------------------------------------------------------------------------
# build: fill a venv at /opt/venv with torch, the pins and detectron2 (its ops compiled against
# the pinned torch with DETECTRON2_SOURCE=git). On a CUDA devel base (an arg set), its nvcc;
# else NVIDIA's nvcc wheels from PyPI, only for that step.
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

# Out of the venv the train stage copies, what no process of a run loads (0.4 GB of 5.9 GB;
# docs/benchmarks.md, "Time to the first iteration on the real node"): static archives (for
# linking only; detectron2's ops are built above) and the NVIDIA libraries that nothing in the
# venv links or opens (cuda-pathfinder's catalog lists them for a caller that asks; none does):
# cuSOLVERMg, the alternative NVRTC, NVBLAS and cuFFTW. A step of its own: joined to the one
# above, a change here would compile detectron2's CUDA ops again (35 min).
# hadolint ignore=DL3059
RUN find /opt/venv -type f \( -name '*.a' -o -name 'libcusolverMg.so*' -o -name 'libnvblas.so*' \
        -o -name 'libnvrtc.alt.so*' -o -name 'libnvrtc-builtins.alt.so*' -o -name 'libcufftw.so*' \) \
        -delete

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
# The distribution's Python with venv (Debian 12's 3.11), and jemalloc: the controller's
# memory allocator (ENV below). Same reason as in the build stage for no apt pins.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv libjemalloc2 \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
# The base dependencies and the [controller] extra (kopf, the Kubernetes client, ...) at their
# pinned versions, read from pyproject.toml, in a venv; then the project in a layer of its own,
# so a change to the code does not download the dependencies again.
COPY pyproject.toml imagebuild/pins.py /src/
RUN python3 -m venv /opt/venv \
    && python3 /src/pins.py /src/pyproject.toml controller > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm -rf /src /tmp/requirements.txt \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin megdet
COPY . /src
# Declared here, not at the top of the stage: an ARG is part of the cache key of every RUN after it.
ARG README_STUB
RUN printf '%s\n' "$README_STUB" > /src/README.md \
    && pip install --no-cache-dir --no-deps /src \
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
# train (the default target): Python and the venv from the build stage. torch's wheels carry the
# CUDA runtime, cuDNN and NCCL; on a CUDA base (an arg set), take its runtime flavour, not cuDNN.
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
# libibverbs1 + ibverbs-providers (rdma-core's user space; the names in Debian 12 and Ubuntu
# 24.04): NCCL dlopens
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
# The whole context: .dockerignore keeps it to pyproject.toml and the packages.
COPY . /src
ARG README_STUB
RUN printf '%s\n' "$README_STUB" > /src/README.md \
    && pip install --no-cache-dir --no-deps --no-build-isolation /src \
    && rm -rf /src \
    && python -c "import torch, detectron2; print('torch', torch.__version__, 'CUDA', torch.version.cuda)" \
    && megdet --version
USER 10001:10001
WORKDIR /output
# tini is PID 1: it reaps zombies and passes SIGTERM to `megdet launch`, which passes it to
# torchrun and so to every trainer process (they checkpoint before the pod dies).
ENTRYPOINT ["/usr/bin/tini", "--", "megdet", "launch"]
CMD ["train", "--config", "megdet_R50_FPN_1x.yaml"]
