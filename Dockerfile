# syntax=docker/dockerfile:1
#
# Two images from one file (see docs/image.md):
#   docker build -t megdet:0.1.0 .                                  training image (CUDA)
#   docker build --target controller -t megdet-controller:0.1.0 .  controller (no torch, no CUDA)
#
# Every version below defaults to the project's pin list in pyproject.toml
# ([project.optional-dependencies] and [tool.megdet]); tests/image checks that they agree.

# CUDA 12.6: torch 2.14's legacy build, its only one with Volta (V100) kernels. PyPI's default
# is a CUDA 13 build and CUDA 13 dropped Volta; the cu128 builds dropped it in torch 2.11.
ARG CUDA_VERSION=12.6.3
ARG UBUNTU_VERSION=24.04
ARG TORCH_CUDA_TAG=cu126
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1
ARG DETECTRON2_REPO=https://github.com/facebookresearch/detectron2
ARG DETECTRON2_COMMIT=02b5c4e295e990042a714712c21dc79b731e8833
# V100 (7.0), A100 (8.0), H100 (9.0), plus PTX for newer GPUs to JIT-compile.
ARG TORCH_CUDA_ARCH_LIST="7.0;8.0;9.0+PTX"
ARG CONTROLLER_PYTHON=3.12
# Image metadata (OCI labels); pass --build-arg VCS_REF=$(git rev-parse HEAD) etc.
ARG VERSION=0.1.0
ARG VCS_REF=unknown
ARG SOURCE_URL=unknown

# ---------------------------------------------------------------------------------------------
# build: compile detectron2's CUDA ops against the pinned torch and fill a venv at /opt/venv.
# The devel flavour without cuDNN: detectron2's ops do not use it, and torch's wheel brings its own.
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build
ARG TORCH_CUDA_TAG
ARG TORCH_VERSION
ARG TORCHVISION_VERSION
ARG DETECTRON2_REPO
ARG DETECTRON2_COMMIT
ARG TORCH_CUDA_ARCH_LIST
# Parallel nvcc jobs; each can take several GB of RAM.
ARG MAX_JOBS=8
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

# Ubuntu's archive drops superseded package versions, so apt pins would break the build within
# weeks; the base image tag fixes the Ubuntu release and with it the package series.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        build-essential python3.12 python3.12-dev python3.12-venv git ca-certificates ninja-build \
    && rm -rf /var/lib/apt/lists/*

RUN python3.12 -m venv /opt/venv \
    && pip install --no-cache-dir \
        --index-url "https://download.pytorch.org/whl/${TORCH_CUDA_TAG}" \
        "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"

# The rest of the training pins, read from pyproject.toml (never retyped here). torch and
# torchvision are constrained to the builds above so pip fails rather than swap in PyPI's.
COPY pyproject.toml /src/pyproject.toml
COPY image/pins.py /src/pins.py
RUN python /src/pins.py /src/pyproject.toml train --exclude torch torchvision \
        > /tmp/requirements.txt \
    && printf 'torch==%s\ntorchvision==%s\n' "${TORCH_VERSION}" "${TORCHVISION_VERSION}" \
        > /tmp/constraints.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt -c /tmp/constraints.txt

# detectron2 from the pinned commit, with its CUDA ops. FORCE_CUDA because no GPU is visible
# during `docker build`. --no-deps: its setup.py caps iopath below our pin and wants black and
# scipy, which training does not import; its runtime deps are in the pin list above.
WORKDIR /tmp/detectron2
RUN git init --quiet \
    && git remote add origin "${DETECTRON2_REPO}" \
    && git fetch --quiet --depth 1 origin "${DETECTRON2_COMMIT}" \
    && git checkout --quiet FETCH_HEAD \
    && test "$(git rev-parse HEAD)" = "${DETECTRON2_COMMIT}" \
    && FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}" MAX_JOBS="${MAX_JOBS}" \
        pip install --no-cache-dir --no-deps --no-build-isolation . \
    && rm -rf /tmp/detectron2

# The project itself (its dependencies are already installed from the same pins). The whole
# context: .dockerignore keeps it to pyproject.toml, README.md and the package folders.
COPY . /src
WORKDIR /src
RUN pip install --no-cache-dir --no-deps . \
    && python -c "import torch, detectron2._C as C; \
assert C.has_cuda(), 'detectron2 was built without CUDA'; \
assert torch.version.cuda, 'torch is a CPU build'; \
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'detectron2 CUDA', C.get_cuda_version())" \
    && megdet --version

# ---------------------------------------------------------------------------------------------
# controller: the MegDetRun operator. Python only: no torch, no CUDA.
FROM python:${CONTROLLER_PYTHON}-slim-bookworm AS controller
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
    PYTHONUNBUFFERED=1
COPY . /src
# The [controller] extra: kopf and the Kubernetes client at their pinned versions.
RUN pip install --no-cache-dir "/src[controller]" \
    && rm -rf /src \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin megdet
# The run chart: the controller renders each MegDetRun's job with it, in process (one job builder).
COPY charts/megdet /opt/megdet/charts/megdet
ENV MEGDET_CHART_DIR=/opt/megdet/charts/megdet
USER 10001:10001
ENTRYPOINT ["megdet"]
# `megdet controller`: the MegDetRun operator (docs/operations.md).
CMD ["controller"]

# ---------------------------------------------------------------------------------------------
# train (the default target): the CUDA runtime, Python and the venv from the build stage.
# No cuDNN flavour: torch's wheel carries its own cuDNN (and NCCL), a second copy would be dead
# weight. The runtime flavour provides libcudart for detectron2's compiled ops.
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS train
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

# Same reason as in the build stage: the base image tag pins the Ubuntu package series.
# libibverbs1 + ibverbs-providers (rdma-core's user space; Ubuntu 24.04 names): NCCL dlopens
# libibverbs.so.1, which loads the HCA's provider (libmlx5-rdmav*.so); without them NCCL's
# InfiniBand transport finds no device and falls back to TCP sockets. `megdet doctor` checks.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 tini libibverbs1 ibverbs-providers \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin megdet \
    && mkdir -p /data /output \
    && chown 10001:10001 /output

COPY --from=build /opt/venv /opt/venv
USER 10001:10001
WORKDIR /output
# tini is PID 1: it reaps zombies and passes SIGTERM to `megdet launch`, which passes it to
# torchrun and so to every trainer process (they checkpoint before the pod dies).
ENTRYPOINT ["/usr/bin/tini", "--", "megdet", "launch"]
CMD ["train", "--config", "megdet_R50_FPN_1x.yaml"]
