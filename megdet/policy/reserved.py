"""What a run's author may never set, whatever the policy lets through: the names and paths the
image, the run chart, Python, torch, iopath/fvcore and the launcher read or use.

Each list is written once here and generated into the policy's CEL; why each name is on it:
docs/operations.md, "Who may do what" (the ``envNames``, ``loaderEnv``, ``mountPrefixes`` rows).
"""

from __future__ import annotations

import re

__all__ = [
    "LOADER_ENV",
    "LOADER_ENV_PREFIXES",
    "PLATFORM_KEY_PREFIXES",
    "RESERVED_ENV",
    "RESERVED_ENV_PREFIXES",
    "RESERVED_MOUNTS",
    "reserved_env_re",
    "reserved_mount_re",
]

#: Variables that make a process load code from a path: every LD_* of the dynamic loader and
#: these names. Reserved like the rest, but behind their own value (``policy.loaderEnv``).
LOADER_ENV_PREFIXES = ("LD_",)
LOADER_ENV: tuple[str, ...] = (
    "BASH_ENV",
    "CUDA_INJECTION32_PATH",
    "CUDA_INJECTION64_PATH",
    "ENV",
    "GCONV_PATH",
    "HOME",
    "NCCL_CONF_FILE",
    "NCCL_ENV_PLUGIN",
    "NCCL_NET_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "NODE_OPTIONS",
    "OPENSSL_CONF",
    "OPENSSL_ENGINES",
    "OPENSSL_MODULES",
    "PERL5LIB",
    "PERL5OPT",
    "PYTHONBREAKPOINT",
    "PYTHONEXECUTABLE",
    "PYTHONHOME",
    "PYTHONINSPECT",
    "PYTHONNOUSERSITE",
    "PYTHONPATH",
    "PYTHONPLATLIBDIR",
    "PYTHONPYCACHEPREFIX",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PYTHONWARNINGS",
    "RUBYOPT",
)

#: Prefixes of the variables the pods' software reads (Python, torch and torchrun, iopath,
#: detectron2, the chart and launcher, NCCL, CUDA, glibc, Kubernetes).
RESERVED_ENV_PREFIXES: tuple[str, ...] = (
    "CUDA_",
    "DETECTRON2_",
    "GLIBC_",
    "IOPATH_",
    "KUBEFLOW_",
    "KUBERNETES_",
    "MEGDET_",
    "NCCL_",
    "NVIDIA_",
    "PET_",
    "PYTHON",
    "PYTORCH_",
    "TORCH",
)
#: Single names the image, torchrun, OpenMP, the trainer and the weights' download read.
RESERVED_ENV: tuple[str, ...] = (
    *LOADER_ENV,
    "ALL_PROXY",
    "CURL_CA_BUNDLE",
    "FVCORE_CACHE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "NO_PROXY",
    "OMP_NUM_THREADS",
    "PATH",
    "PROMETHEUS_MULTIPROC_DIR",
    "RANK",
    "REQUESTS_CA_BUNDLE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "SSL_CERT_DIR",
    "SSL_CERT_FILE",
    "TMPDIR",
    "USER",
    "WORLD_SIZE",
    "XDG_CACHE_HOME",
)

#: Paths the run chart mounts (charts/megdet/templates/_pod.tpl; a test holds this list to
#: what the chart renders) and the image uses. An extra mount may not be at, above, under or
#: beside (in the same folder as) any of them; / as a top-level path's folder stays free.
RESERVED_MOUNTS: tuple[str, ...] = (
    "/data",
    "/output",
    "/dev/shm",
    "/var/run/secrets/megdet.io/progress",
    "/opt/venv",
    "/usr",
    "/home/megdet",
    "/tmp",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/etc",
    "/dev",
    "/proc",
    "/sys",
    "/root",
    "/run",
    "/var",
)

#: Pod label and annotation key prefixes the platform writes, never a run's, whatever
#: policy.labelPrefixes and policy.annotationPrefixes allow.
PLATFORM_KEY_PREFIXES: tuple[str, ...] = ("megdet.io/",)


def reserved_env_re() -> str:
    """RE2: a reserved variable name (one of :data:`RESERVED_ENV_PREFIXES` or the LD_ prefix)."""
    prefixes = (*LOADER_ENV_PREFIXES, *RESERVED_ENV_PREFIXES)
    return "^(" + "|".join(re.escape(p) for p in prefixes) + ")"


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def reserved_mount_re() -> str:
    """RE2 on a normalized path: at, under, above or beside one of :data:`RESERVED_MOUNTS`."""
    alternatives = []
    for path in RESERVED_MOUNTS:
        alternatives.append(re.escape(path) + "(/.*)?")  # at or under
        parts = path.split("/")[1:-1]
        alternatives += [re.escape("/" + "/".join(parts[: i + 1])) for i in range(len(parts))]
        if _parent(path) != "/":
            alternatives.append(re.escape(_parent(path)) + "/[^/]+")  # beside
    return "^(" + "|".join(dict.fromkeys(alternatives)) + ")$"
