"""Run a function in N spawned gloo processes (CPU), for the distributed trainer tests."""

from __future__ import annotations

import os
import tempfile


def _entry(rank: int, world: int, init_file: str, fn, args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", world_size=world, rank=rank)
    try:
        fn(rank, world, *args)
        # No rank tears down its gloo connections while another may still read from them (a
        # rank that leaves first can make its peer abort with SIGABRT under load).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_distributed(world: int, fn, *args) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned gloo processes (CPU)."""
    import torch.multiprocessing as mp

    fd, init_file = tempfile.mkstemp(prefix="megdet-dist-")
    os.close(fd)
    os.unlink(init_file)  # the file store creates it
    try:
        mp.spawn(_entry, args=(world, init_file, fn, args), nprocs=world, join=True)
    finally:
        if os.path.exists(init_file):
            os.unlink(init_file)
