"""Start the training processes: spawn N local workers, or be one rank of a torchrun world.

* Started by torchrun (``megdet launch`` in a pod, or torchrun by hand): this process is one
  worker; it initializes the process group from the env torchrun's agent set for it.
* Otherwise ``num_workers`` processes are started on this machine (gloo on CPU, NCCL on GPUs)
  on a free localhost port; the parent passes SIGTERM on to them (:mod:`megdet.signals`).
  They are spawned (a new interpreter each) unless the caller asks for ``fork``
  (:func:`start_method`), which ``megdet train`` and ``megdet demo`` do for CPU workers.

"Started by torchrun" is keyed on ``TORCHELASTIC_RUN_ID``, which torchrun's agent sets for every
worker (torch/distributed/elastic/agent/server/local_elastic_agent.py, ``_start_workers``) and
no operator sets. ``RANK``/``WORLD_SIZE``/``MASTER_*`` alone do not say it: the Kubeflow
PyTorchJob operator sets them on the pod, ``RANK`` being the NODE rank and ``WORLD_SIZE``
often the node count. A pod that runs ``megdet train`` without ``megdet launch`` is refused
(:func:`bare_pod_problem`) rather than joining a world of the wrong size or training alone.

A worker function takes one picklable argument (its task) and returns an exit code. This module
is the trainer's side; ``megdet launch`` (the pod entrypoint that starts torchrun) is
:mod:`megdet.image.launcher`.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from megdet.signals import SignalForwarder

#: Set by torchrun's agent for each worker it starts, and by nobody else.
TORCHRUN_MARKER = "TORCHELASTIC_RUN_ID"
#: The pod's CPU request in millicpus, which the run chart passes with the Downward API
#: (``resourceFieldRef`` ``requests.cpu``, divisor 1m); 0 or unset: none (:func:`cpu_threads`).
POD_MILLICPUS_ENV = "MEGDET_POD_MILLICPUS"
#: What a rank initializes its process group from (torchrun sets them per process).
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: Set on a pod by the Kubeflow operators (v1 PyTorchJob: all; Trainer v2: the PET_ ones).
OPERATOR_ENV = ("PET_NNODES", "PET_NODE_RANK", "RANK", "WORLD_SIZE")

Worker = Callable[[Any], int]
#: Seconds the other local workers get to end by themselves once one has exited non-zero,
#: before torch's join sends them SIGTERM (then SIGKILL after as long again). On a SIGTERM
#: stop every rank saves the same checkpoint and exits 143, the first one a moment before the
#: others, whose after_train (the metrics folder's clean-up, for one) must not be cut off;
#: a rank that crashed ends the others' collectives within seconds (gloo sees the peer gone:
#: a rank raising while the other waited in a barrier ended the run in 2.7 s). 30 s is also
#: torchrun's own default wait before SIGKILL (``--shutdown-timeout``, torch/distributed/run.py).
#: Before this, ``megdet train --num-workers 2`` stopped by SIGTERM killed rank 0 in its
#: after_train and left the metrics folder's value files in /tmp.
STOP_GRACE_S = 30.0


def in_torchrun(env: Mapping[str, str] = os.environ) -> bool:
    """Whether torchrun started this process as one rank of its world."""
    return TORCHRUN_MARKER in env and all(key in env for key in TORCHRUN_ENV)


def bare_pod_problem(env: Mapping[str, str] = os.environ) -> str | None:
    """Why this process must not train here, or None.

    An operator's pod env (PET_NNODES, RANK, WORLD_SIZE...) without torchrun means
    ``megdet train`` was run as the container command instead of ``megdet launch train``.
    """
    if in_torchrun(env):
        return None
    found = [key for key in OPERATOR_ENV if key in env]
    if not found:
        return None
    shown = ", ".join(f"{key}={env[key]}" for key in found)
    return (
        f"{shown} set but this process was not started by torchrun ({TORCHRUN_MARKER} is "
        "unset): in a PyTorchJob/TrainJob pod these describe the NODES, not the training "
        "processes. Run `megdet launch train ...` (the image's entrypoint), which starts "
        "torchrun with the right world size; or unset them to train on this machine alone"
    )


def env_world() -> tuple[int, int]:
    """World size and local (per-node) world size from torchrun's environment."""
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return world, local


def _backend(use_cuda: bool) -> str:
    return "nccl" if use_cuda else "gloo"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_threads(local_world: int, env: Mapping[str, str] = os.environ) -> int:
    """Intra-op threads of each of a machine's (or pod's) ``local_world`` CPU workers: they
    share the CPUs the pod asked for (:data:`POD_MILLICPUS_ENV`, rounded up to whole CPUs) or,
    without it, the machine's; at least 1 each. More threads than that only oversubscribe the
    cores, which other pods on the node use too: two 1-CPU pods of 2 threads each on 2 cores
    trained the tiny config at about 2 s an iteration, at 1 thread each at 0.5 s."""
    cpus = os.cpu_count() or 1
    raw = env.get(POD_MILLICPUS_ENV, "").strip()
    if raw:
        if not raw.isdigit():
            from megdet.trainer.config import ConfigError

            raise ConfigError(
                f"{POD_MILLICPUS_ENV}={raw!r}: not a whole number of millicpus (the run chart "
                "sets it from the pod's CPU request: 500 for 500m, 32000 for 32)"
            )
        if int(raw) > 0:
            cpus = min(cpus, -(-int(raw) // 1000))
    return max(1, cpus // local_world)


def _after_init(local_world: int, local_rank: int, use_cuda: bool) -> None:
    import torch
    from detectron2.utils import comm

    comm.create_local_process_group(local_world)
    if use_cuda:
        torch.cuda.set_device(local_rank)
    else:
        torch.set_num_threads(cpu_threads(local_world))
    comm.synchronize()


def _run_from_env(worker: Worker, task: Any, use_cuda: bool) -> int:
    import torch.distributed as dist

    _, local = env_world()
    dist.init_process_group(_backend(use_cuda), init_method="env://")
    try:
        _after_init(local, int(os.environ.get("LOCAL_RANK", 0)), use_cuda)
        return worker(task)
    finally:
        dist.destroy_process_group()


def _spawned_entry(
    local_rank: int, worker: Worker, task: Any, world: int, url: str, use_cuda: bool
) -> None:
    import torch.distributed as dist

    dist.init_process_group(_backend(use_cuda), init_method=url, world_size=world, rank=local_rank)
    try:
        _after_init(world, local_rank, use_cuda)
        code = worker(task)
    finally:
        dist.destroy_process_group()
    if code:
        sys.exit(code)


def start_method(use_cuda: bool) -> str:
    """How a fresh ``megdet train`` or ``megdet demo`` process starts its local workers.

    ``fork`` for CPU workers on Linux: the workers inherit the imports the parent already made
    (torch, detectron2, the trainer: about 6 CPU-seconds a process), where a spawned worker
    imports them again. Measured side by side (``bench/worker_start.py``, docs/benchmarks.md):
    a 2-worker run of 2 iterations took 8.2 s and 9.9 CPU-s forked against 14.9 s and 21.3
    CPU-s spawned.

    ``spawn`` everywhere else. CUDA cannot be used again in a forked child once the parent has
    asked for a device (torch/cuda/__init__.py, ``_lazy_init``: "Cannot re-initialize CUDA in
    forked subprocess"), and fork copies only the calling thread: a parent with other threads
    (a test runner's, a server's) can leave a lock held in the child forever. The same holds
    for OpenMP: a parent that ran a multi-threaded torch op has a thread pool its children do
    not get, and their first op on more than one thread waits for it (tried: torch 2.14's
    libgomp, a 2000x2000 matmul in the parent, 2 threads in each child: it never returned).
    So the callers are the CLI's own processes, which run no tensor op before this point
    (tests/trainer/test_trainer_cli.py checks that no thread appears), and this also requires
    the calling thread to be the only one.
    """
    if use_cuda or sys.platform != "linux" or threading.active_count() > 1:
        return "spawn"
    return "fork"


def _spawn(worker: Worker, task: Any, num_workers: int, use_cuda: bool, method: str) -> int:
    import torch.multiprocessing as mp

    url = f"tcp://127.0.0.1:{_free_port()}"
    context = mp.start_processes(
        _spawned_entry,
        args=(worker, task, num_workers, url, use_cuda),
        nprocs=num_workers,
        join=False,
        start_method=method,
    )

    def targets() -> list[int]:
        # The workers save a checkpoint and exit; the parent waits for them.
        return [p.pid for p in context.processes if p.is_alive() and p.pid]

    with SignalForwarder(targets) as forwarder:
        while True:
            try:
                if context.join(grace_period=STOP_GRACE_S):
                    return forwarder.status(0)
            except mp.ProcessExitedException as err:
                return forwarder.status(err.exit_code)
            except mp.ProcessRaisedException as err:
                print(err, file=sys.stderr)
                return forwarder.status(1)


def run_workers(
    worker: Worker,
    task: Any,
    num_workers: int = 1,
    use_cuda: bool = False,
    method: str = "spawn",
) -> int:
    """Run ``worker(task)`` in every process of the world; return the run's exit code.

    ``method``: how local workers start, ``spawn`` or ``fork`` (only what :func:`start_method`
    returns; ``fork`` from a process that may have run tensor ops or started threads is not
    safe)."""
    if method not in ("spawn", "fork"):
        raise ValueError(f"method: {method!r} (allowed: spawn, fork)")
    if in_torchrun():
        return _run_from_env(worker, task, use_cuda)
    if num_workers == 1:
        return worker(task)
    return _spawn(worker, task, num_workers, use_cuda, method)
