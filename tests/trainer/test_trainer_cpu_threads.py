"""trainer/workers.py's CPU threads: a pod's CPU workers share the CPUs it asked for (the run
chart's MEGDET_POD_MILLICPUS), not the whole machine's, which other pods on the node use too."""

from __future__ import annotations

import pytest

from megdet.trainer import workers
from megdet.trainer.config import ConfigError


@pytest.fixture(autouse=True)
def eight_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 8)


@pytest.mark.parametrize(
    ("millicpus", "local_world", "threads"),
    [
        ("500", 1, 1),  # README's tiny run: 500m, one process a pod
        ("1500", 1, 2),  # rounded up to whole CPUs
        ("4000", 2, 2),
        ("32000", 1, 8),  # never more than the machine has
        ("0", 2, 4),  # no request: the machine's cores
        ("", 1, 8),
        ("1000", 4, 1),  # at least one each
    ],
)
def test_a_pods_cpu_workers_share_the_cpus_it_asked_for(
    millicpus: str, local_world: int, threads: int
) -> None:
    env = {workers.POD_MILLICPUS_ENV: millicpus} if millicpus else {}
    assert workers.cpu_threads(local_world, env) == threads


def test_a_request_that_is_not_millicpus_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"MEGDET_POD_MILLICPUS='0\.5': not a whole number"):
        workers.cpu_threads(1, {workers.POD_MILLICPUS_ENV: "0.5"})


def test_the_suites_processes_get_one_thread_each() -> None:
    """tests/conftest.py: the suite's cores are always taken, so each process it starts trains
    on one thread: torch's default from OMP_NUM_THREADS, the trainer's from the pod variable."""
    import os
    import subprocess
    import sys

    import torch

    from tests.conftest import ONE_CPU

    assert {name: os.environ.get(name) for name in ONE_CPU} == ONE_CPU
    assert workers.cpu_threads(1) == workers.cpu_threads(2) == 1
    assert torch.get_num_threads() == 1
    child = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert child.stdout.strip() == "1"
