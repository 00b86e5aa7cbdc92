"""From the env the Kubeflow operator injects to torchrun's arguments. Pure: no torch, no I/O.

The PyTorchJob operator (kubeflow.org/v1) sets, in every pod:

- ``PET_NNODES``: the number of pods (Master + Workers);
- ``PET_NODE_RANK`` and ``RANK``: this pod's index, 0 for the Master (a NODE rank);
- ``PET_NPROC_PER_NODE``: ``spec.nprocPerNode`` as written, an integer or auto/gpu/cpu;
- ``MASTER_ADDR``/``MASTER_PORT`` (and the same as ``PET_MASTER_ADDR``/``PET_MASTER_PORT``);
- ``WORLD_SIZE``: pods x nprocPerNode when nprocPerNode is an integer, otherwise the number of
  pods (kubeflow/trainer#1790). Hence the launcher computes the global world size itself and
  only uses ``WORLD_SIZE`` as a consistency check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "DEFAULT_MASTER_PORT",
    "NPROC_KEYWORDS",
    "EnvError",
    "LaunchTopology",
    "topology_from_env",
    "torchrun_arguments",
]

#: torchrun's own default port, used when MASTER_ADDR is given without a port.
DEFAULT_MASTER_PORT = 29500
#: The non-integer values `spec.nprocPerNode` accepts.
NPROC_KEYWORDS = ("auto", "gpu", "cpu")


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
    return LaunchTopology(
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=nproc,
        master_addr=master_addr,
        master_port=master_port,
        nproc_source=nproc_source,
    )


def torchrun_arguments(topology: LaunchTopology) -> list[str]:
    """torchrun's options (before the script) for this pod.

    Explicit options, because torchrun would otherwise read ``PET_NPROC_PER_NODE=auto`` itself
    and start one process per CPU core on a GPU-less node.
    """
    if topology.standalone:
        return ["--standalone", "--nnodes=1", f"--nproc-per-node={topology.nproc_per_node}"]
    return [
        f"--nnodes={topology.nnodes}",
        f"--nproc-per-node={topology.nproc_per_node}",
        f"--node-rank={topology.node_rank}",
        f"--master-addr={topology.master_addr}",
        f"--master-port={topology.master_port}",
    ]
