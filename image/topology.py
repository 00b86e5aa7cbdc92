"""From the env the Kubeflow operator injects to torchrun's arguments. Pure: no torch, no I/O.

The PyTorchJob operator (kubeflow.org/v1) sets, in every pod:

- ``PET_NNODES``: the number of pods (Master + Workers);
- ``PET_NODE_RANK`` and ``RANK``: this pod's index, 0 for the Master (a NODE rank);
- ``PET_NPROC_PER_NODE``: ``spec.nprocPerNode`` as written, an integer or auto/gpu/cpu;
- ``MASTER_ADDR``/``MASTER_PORT`` (and the same as ``PET_MASTER_ADDR``/``PET_MASTER_PORT``);
- ``WORLD_SIZE``: pods x nprocPerNode when nprocPerNode is an integer, otherwise the number of
  pods (kubeflow/trainer#1790). Hence the launcher computes the global world size itself and
  only uses ``WORLD_SIZE`` as a consistency check.

Kubeflow Trainer v2 (TrainJob, kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/torch/
torch.go``) injects only the ``PET_*`` five: ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``; the aliases below cover it.

The run chart adds what no operator knows (docs/image.md):

- ``MEGDET_GRACE_PERIOD_SECONDS``: the pod's ``terminationGracePeriodSeconds``; torchrun's
  ``--shutdown-timeout`` is that minus :data:`SHUTDOWN_MARGIN_SECONDS`;
- ``MEGDET_MAX_RESTARTS``: torchrun's ``--max-restarts`` (chart value ``workerRestarts``);
- ``MEGDET_RUN_ID``: the rendezvous id (the job's name).
- ``MEGDET_POD_MILLICPUS``: the pod's CPU request (the run chart's Downward API), which sizes the
  CPU workers' threads; checked here, read by :func:`megdet.trainer.workers.cpu_threads`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from megdet.trainer.workers import POD_MILLICPUS_ENV

__all__ = [
    "DEFAULT_MASTER_PORT",
    "DEFAULT_RUN_ID",
    "NPROC_KEYWORDS",
    "SHUTDOWN_MARGIN_SECONDS",
    "TORCHRUN_DEFAULT_SHUTDOWN_TIMEOUT",
    "EnvError",
    "LaunchTopology",
    "topology_from_env",
    "torchrun_arguments",
]

#: torchrun's own default port, used when MASTER_ADDR is given without a port.
DEFAULT_MASTER_PORT = 29500
#: The non-integer values `spec.nprocPerNode` accepts.
NPROC_KEYWORDS = ("auto", "gpu", "cpu")
#: Seconds of the pod's grace period kept back from torchrun's shutdown timeout: after that
#: timeout torchrun SIGKILLs the trainers, tears its agent down and exits, and the launcher
#: reports the exit status; all that must happen before the kubelet's own SIGKILL.
SHUTDOWN_MARGIN_SECONDS = 10
#: What torchrun waits after passing SIGTERM on when nothing says otherwise
#: (torch/distributed/launcher/api.py: TORCH_ELASTIC_SHUTDOWN_TIMEOUT, default "30").
TORCHRUN_DEFAULT_SHUTDOWN_TIMEOUT = 30
#: The rendezvous id when MEGDET_RUN_ID is unset (one job per rendezvous endpoint anyway).
DEFAULT_RUN_ID = "megdet"


class EnvError(ValueError):
    """An environment variable the launcher cannot use. ``variable`` names it."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable
        self.message = message


@dataclass(frozen=True)
class LaunchTopology:
    """Where this pod sits in the job, resolved from the env."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str | None
    master_port: int | None
    #: how ``nproc_per_node`` was decided, e.g. "PET_NPROC_PER_NODE=8" or "auto: 8 GPUs"
    nproc_source: str
    #: torchrun's --shutdown-timeout; None: MEGDET_GRACE_PERIOD_SECONDS unset, torchrun's 30 s
    shutdown_timeout: int | None = None
    #: torchrun's --max-restarts: how often a failed worker group restarts, on every node
    max_restarts: int = 0
    #: torchrun's --rdzv-id
    run_id: str = DEFAULT_RUN_ID

    @property
    def world_size(self) -> int:
        """The global number of training processes (what the trainer plans with)."""
        return self.nnodes * self.nproc_per_node

    @property
    def standalone(self) -> bool:
        """One node and nobody to rendezvous with: torchrun hosts its own store."""
        return self.nnodes == 1 and self.master_addr is None


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _whole(env: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    text = _get(env, name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise EnvError(name, f"{text!r} is not a whole number") from None
    if value < minimum:
        raise EnvError(name, f"{value} must be >= {minimum}")
    return value


def _one_of(env: Mapping[str, str], primary: str, alias: str) -> tuple[str, str | None]:
    """The value of `primary`, else of `alias`; both set and different is an error."""
    a, b = _get(env, primary), _get(env, alias)
    if a is not None and b is not None and a != b:
        raise EnvError(primary, f"{a!r} disagrees with {alias}={b!r}; set one or make them equal")
    if a is not None:
        return primary, a
    return alias, b


def _nnodes(env: Mapping[str, str]) -> int:
    text = _get(env, "PET_NNODES")
    if text is not None and ":" in text:
        # elasticPolicy writes "min:max"; the plan (LR, schedule) needs a fixed world size.
        raise EnvError(
            "PET_NNODES",
            f"{text!r} is an elastic range; megdet launch needs a fixed number of nodes "
            "(remove elasticPolicy from the PyTorchJob)",
        )
    value = _whole(env, "PET_NNODES", minimum=1)
    return 1 if value is None else value


def _nproc(env: Mapping[str, str], visible_gpus: int | Callable[[], int]) -> tuple[int, str]:
    text = _get(env, "PET_NPROC_PER_NODE") or "auto"
    if text.lower() not in NPROC_KEYWORDS:
        try:
            value = int(text)
        except ValueError:
            raise EnvError(
                "PET_NPROC_PER_NODE",
                f"{text!r} is not allowed; use a whole number >= 1 or one of "
                + ", ".join(NPROC_KEYWORDS),
            ) from None
        if value < 1:
            raise EnvError("PET_NPROC_PER_NODE", f"{value} must be >= 1")
        return value, f"PET_NPROC_PER_NODE={value}"
    keyword = text.lower()
    if keyword == "cpu":
        # torchrun would start one process per core; one process already uses every core
        # through intra-op threads, and a detector per core only multiplies memory.
        return 1, "cpu: 1 process"
    gpus = visible_gpus() if callable(visible_gpus) else visible_gpus
    if gpus > 0:
        return gpus, f"{keyword}: {gpus} visible GPU(s)"
    if keyword == "gpu":
        raise EnvError(
            "PET_NPROC_PER_NODE",
            "'gpu' but no GPU is visible in this pod (check the nvidia.com/gpu request and "
            "the NVIDIA device plugin), or use 'cpu' or a whole number",
        )
    return 1, "auto: no GPU visible, 1 CPU process"


def _shutdown_timeout(env: Mapping[str, str]) -> int | None:
    """Grace period minus the margin, or None when the grace period is not given."""
    name = "MEGDET_GRACE_PERIOD_SECONDS"
    grace = _whole(env, name, minimum=0)
    if grace is None:
        return None
    if grace <= SHUTDOWN_MARGIN_SECONDS:
        raise EnvError(
            name,
            f"{grace} leaves no time to checkpoint: it must be above the launcher's "
            f"{SHUTDOWN_MARGIN_SECONDS} s margin (set terminationGracePeriodSeconds higher)",
        )
    return grace - SHUTDOWN_MARGIN_SECONDS


def _run_id(env: Mapping[str, str]) -> str:
    run_id = _get(env, "MEGDET_RUN_ID") or DEFAULT_RUN_ID
    if not all(c.isalnum() or c in "-_." for c in run_id):
        raise EnvError("MEGDET_RUN_ID", f"{run_id!r}: use letters, digits, '-', '_' and '.'")
    return run_id


def topology_from_env(
    env: Mapping[str, str], visible_gpus: int | Callable[[], int] = 0
) -> LaunchTopology:
    """Resolve this pod's place in the job from the operator's env, or raise EnvError.

    ``visible_gpus`` (a count, or a function returning it, called only for auto/gpu) resolves
    ``PET_NPROC_PER_NODE=auto|gpu``: one process per visible GPU; without GPUs ``auto`` and
    ``cpu`` give one process.
    """
    nnodes = _nnodes(env)
    rank_var, rank_text = _one_of(env, "PET_NODE_RANK", "RANK")
    node_rank = _whole({rank_var: rank_text or ""}, rank_var, minimum=0) or 0
    if node_rank >= nnodes:
        raise EnvError(
            rank_var, f"{node_rank} must be below PET_NNODES ({nnodes}); node ranks are 0..nnodes-1"
        )
    nproc, nproc_source = _nproc(env, visible_gpus)

    _, master_addr = _one_of(env, "MASTER_ADDR", "PET_MASTER_ADDR")
    port_var, port_text = _one_of(env, "MASTER_PORT", "PET_MASTER_PORT")
    master_port = _whole({port_var: port_text or ""}, port_var, minimum=1)
    if master_port is not None and master_port > 65535:
        raise EnvError(port_var, f"{master_port} is not a TCP port (1..65535)")
    if master_addr is None and nnodes > 1:
        raise EnvError(
            "MASTER_ADDR",
            f"is not set but PET_NNODES is {nnodes}; the nodes need an address to meet at",
        )
    if master_addr is not None and master_port is None:
        master_port = DEFAULT_MASTER_PORT

    world = _whole(env, "WORLD_SIZE", minimum=1)
    if world is not None and world not in (nnodes, nnodes * nproc):
        raise EnvError(
            "WORLD_SIZE",
            f"{world} matches neither PET_NNODES ({nnodes}) nor PET_NNODES x processes per node "
            f"({nnodes} x {nproc} = {nnodes * nproc}); the pods disagree about the job's size",
        )
    # The trainer's CPU workers size their threads from it (megdet.trainer.workers); a value
    # they cannot read is refused here, once, not by every torchrun worker.
    _whole(env, POD_MILLICPUS_ENV, minimum=0)
    return LaunchTopology(
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=nproc,
        master_addr=master_addr,
        master_port=master_port,
        nproc_source=nproc_source,
        shutdown_timeout=_shutdown_timeout(env),
        max_restarts=_whole(env, "MEGDET_MAX_RESTARTS", minimum=0) or 0,
        run_id=_run_id(env),
    )


def torchrun_arguments(topology: LaunchTopology) -> list[str]:
    """torchrun's options (before the script) for this pod.

    Explicit options, because torchrun would otherwise read ``PET_NPROC_PER_NODE=auto`` itself
    and start one process per CPU core on a GPU-less node. Several nodes meet through the c10d
    rendezvous (not the static one), hosted by node 0's agent at MASTER_ADDR:MASTER_PORT with
    ``--nnodes=N:N`` (a fixed size): when any worker fails, its agent restarts its workers and
    re-joins, and every other agent sees a node waiting and restarts its own, so the whole world
    restarts together and resumes from the last complete checkpoint (docs/image.md).
    """
    common = [
        f"--nproc-per-node={topology.nproc_per_node}",
        f"--max-restarts={topology.max_restarts}",
    ]
    if topology.shutdown_timeout is not None:
        common.append(f"--shutdown-timeout={topology.shutdown_timeout}")
    if topology.standalone:
        return ["--standalone", "--nnodes=1", *common]
    # Node 0 hosts the store; saying so beats torchrun's hostname matching, which two "pods"
    # on one machine (or a Service name that is not the hostname) would confuse.
    is_host = int(topology.node_rank == 0)
    return [
        f"--nnodes={topology.nnodes}:{topology.nnodes}",
        *common,
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={topology.master_addr}:{topology.master_port}",
        f"--rdzv-id={topology.run_id}",
        f"--rdzv-conf=is_host={is_host}",
    ]
