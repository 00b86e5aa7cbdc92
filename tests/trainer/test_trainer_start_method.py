"""How local workers start (trainer/workers.py ``start_method``): forked from a fresh CLI process
on CPU, spawned where fork is not safe, and the CLI's parent starts no thread before it forks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from megdet.trainer import workers
from tests.conftest import ONE_CPU

#: Runs ``megdet train --num-workers 2`` up to the moment its workers would start, and prints
#: the parent's OS threads then (and just after the imports the CLI needs anyway) and the start
#: method it asked for. It stops there: the training itself is tested elsewhere.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    import numpy, torch  # what the CLI imports anyway (numpy's BLAS starts its threads here)
    import torch.multiprocessing as mp

    def threads():
        return sorted(os.listdir("/proc/self/task"))

    before = threads()

    def at_start(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        print(json.dumps({"before": len(before), "at_start": len(threads()),
                          "method": start_method, "nprocs": nprocs}))
        sys.stdout.flush()
        os._exit(0)

    mp.start_processes = at_start
    from megdet.cli import main

    main(sys.argv[1:])
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="fork is chosen on Linux only")
def test_the_cli_forks_cpu_workers_from_a_parent_that_started_no_thread(shapes, tmp_path):
    argv = ["train", "--config", "megdet_tiny_cpu", "--num-workers", "2"]
    argv += [
        "--train-json",
        str(shapes["train_json"]),
        "--train-images",
        str(shapes["train_images"]),
    ]
    argv += ["--output", str(tmp_path / "out")]
    # A user's environment, not the suite's one thread (tests/conftest.py): with one OpenMP
    # thread a tensor op before the fork would start no pool, and this test could not fail.
    env = {k: v for k, v in os.environ.items() if k not in ONE_CPU}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert (seen["method"], seen["nprocs"]) == ("fork", 2)
    # A thread here (an OpenMP pool after a multi-threaded tensor op, a Python thread, CUDA's)
    # would not exist in the children, which can then wait for it forever.
    assert seen["at_start"] == seen["before"], seen


def test_cuda_workers_are_spawned_and_cpu_workers_forked_only_from_a_single_thread(monkeypatch):
    monkeypatch.setattr(workers.sys, "platform", "linux")
    with monkeypatch.context() as alone:
        alone.setattr(workers.threading, "active_count", lambda: 1)
        assert workers.start_method(use_cuda=False) == "fork"
        assert workers.start_method(use_cuda=True) == "spawn"
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert workers.start_method(use_cuda=False) == "spawn"
    finally:
        stop.set()
        other.join()
    monkeypatch.setattr(workers.threading, "active_count", lambda: 1)
    monkeypatch.setattr(workers.sys, "platform", "darwin")
    assert workers.start_method(use_cuda=False) == "spawn"


def test_an_unknown_start_method_is_refused_by_name():
    with pytest.raises(ValueError, match=r"method: 'forkserver' \(allowed: spawn, fork\)"):
        workers.run_workers(lambda task: 0, None, num_workers=2, method="forkserver")
