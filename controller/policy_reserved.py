"""What a run's author may never set, whatever the policy lets through: the names and paths the
image, the run chart, Python, torch, iopath/fvcore and the launcher read or use.

Each list is written once here; the policy's CEL (:mod:`megdet.controller.policy_rules`,
:mod:`megdet.controller.policy_knobs`) is generated from it, and docs/operations.md ("Who may do
what") describes it. A list of known names, not a proof: the allow-lists (``policy.envNames``,
``policy.mountPrefixes``, ``policy.labelPrefixes``, ``policy.annotationPrefixes``) are the
boundary, these keep the allowed space off what the pods already depend on.
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

#: Environment variables that make a process load code from a path (besides every LD_* of the
#: dynamic loader: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...): Python's import path, startup
#: and user site (HOME holds ~/.local/lib/pythonX.Y/site-packages, whose .pth files run code),
#: the shells' startup files, glibc's iconv modules, CUDA's injection library, NCCL's plugins
#: and config file, OpenSSL's config and engines, and other interpreters' equivalents. They are
#: reserved like the rest, but behind their own policy value (``policy.loaderEnv``).
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

#: Prefixes of the variables the pods' software reads: Python (PYTHON*), torch and its elastic
#: launcher (TORCH*, PYTORCH_*, PET_*: torchrun's flags), iopath/fvcore (IOPATH_*) and
#: detectron2 (DETECTRON2_*: DETECTRON2_ENV_MODULE imports a module), the run chart and the
#: launcher (MEGDET_*, KUBEFLOW_*: the progress reports), NCCL (NCCL_*: set through spec.nccl),
#: CUDA and the NVIDIA container runtime (CUDA_*, NVIDIA_*: which GPUs a pod sees), glibc's
#: tunables (GLIBC_*) and Kubernetes' own service variables (KUBERNETES_*).
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
#: Single names: where tini finds ``megdet`` (PATH) and the user's files (HOME, USER), the
#: trusted-weights cache (FVCORE_CACHE), the caches and temporary files (XDG_CACHE_HOME,
#: TMPDIR), the variables torchrun sets for each worker, OpenMP's thread count, the trainer's
#: metrics folder, and the TLS trust and proxies the weights are downloaded through.
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

#: Paths the run chart mounts (charts/megdet/templates/_pod.tpl: the dataset, the output volume,
#: shared memory, the progress token; a test holds this list to what the chart renders) and the
#: image uses (Dockerfile: the venv and its site-packages, tini and Python under /usr, HOME with
#: the iopath/fvcore and torch caches, /tmp with the metrics folder, the system folders). An
#: extra mount may not be at, above, under or beside (in the same folder as) any of them; a
#: top-level path has / as its folder, which stays free.
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

#: Pod label and annotation key prefixes the platform writes (the controller's megdet.io/ keys,
#: e.g. the progress endpoint's label), never a run's, whatever policy.labelPrefixes and
#: policy.annotationPrefixes allow. The keys the run chart and the job operators set
#: (app.kubernetes.io/, kubeflow.org/, ...) the MegDetRun CRD's own rules refuse.
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
