"""Start the training processes: spawn N local workers, or join a torchrun / PyTorchJob world.

* Inside torchrun (or any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), this
  process is one worker: it initializes the process group from the environment and runs.
* Otherwise ``num_workers`` processes are spawned on this machine (gloo on CPU, NCCL on GPUs)
  on a free localhost port; SIGTERM to the parent is forwarded to them.

A worker function takes one picklable job and returns an exit code.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

Worker = Callable[[Any], int]


def in_torchrun() -> bool:
    """Whether a launcher already made this process one rank of a world."""
    return all(key in os.environ for key in TORCHRUN_ENV)


def env_world() -> tuple[int, int]:
    """World size and local (per-node) world size from the launcher's environment."""
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return world, local


def _backend(use_cuda: bool) -> str:
    return "nccl" if use_cuda else "gloo"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _after_init(local_world: int, local_rank: int, use_cuda: bool) -> None:
    import torch
    from detectron2.utils import comm

    comm.create_local_process_group(local_world)
    if use_cuda:
        torch.cuda.set_device(local_rank)
    else:
        # N CPU workers share the cores; more threads each only oversubscribes them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    comm.synchronize()


def _run_from_env(worker: Worker, job: Any, use_cuda: bool) -> int:
    import torch.distributed as dist

    _, local = env_world()
    dist.init_process_group(_backend(use_cuda), init_method="env://")
    try:
        _after_init(local, int(os.environ.get("LOCAL_RANK", 0)), use_cuda)
        return worker(job)
    finally:
        dist.destroy_process_group()


def _spawned_entry(
    local_rank: int, worker: Worker, job: Any, world: int, url: str, use_cuda: bool
) -> None:
    import torch.distributed as dist

    dist.init_process_group(_backend(use_cuda), init_method=url, world_size=world, rank=local_rank)
    try:
        _after_init(world, local_rank, use_cuda)
        code = worker(job)
    finally:
        dist.destroy_process_group()
    if code:
        sys.exit(code)


def _spawn(worker: Worker, job: Any, num_workers: int, use_cuda: bool) -> int:
    import torch.multiprocessing as mp

    url = f"tcp://127.0.0.1:{_free_port()}"
    context = mp.start_processes(
        _spawned_entry,
        args=(worker, job, num_workers, url, use_cuda),
        nprocs=num_workers,
        join=False,
        start_method="spawn",
    )

    def forward(signum: int, frame: Any) -> None:
        # The workers save a checkpoint and exit; the parent waits for them.
        for process in context.processes:
            if process.is_alive() and process.pid:
                os.kill(process.pid, signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                if context.join():
                    return 0
            except mp.ProcessExitedException as err:
                code = err.exit_code
                return code if code >= 0 else 128 - code
            except mp.ProcessRaisedException as err:
                print(err, file=sys.stderr)
                return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def launch(worker: Worker, job: Any, num_workers: int = 1, use_cuda: bool = False) -> int:
    """Run ``worker(job)`` in every process of the world; return the run's exit code."""
    if in_torchrun():
        return _run_from_env(worker, job, use_cuda)
    if num_workers == 1:
        return worker(job)
    return _spawn(worker, job, num_workers, use_cuda)
