"""For every test folder: the repository root on ``sys.path``, once, and one CPU thread for
each process's tensor ops.

``bench/`` is a top-level folder, not an installed package; tests import it one way,
``from bench import <module>``, whatever runs them (``python -m pytest`` puts the working
directory on the path, a bare ``pytest`` does not).

The suite runs three pytest-xdist workers on CI's two cores beside the real node's pods, so
the cores are always taken. torch's default of a thread per core then costs several times the
CPU: its OpenMP threads (libgomp) spin while they wait for cores that others hold. Two
one-process tiny trainings side by side on the 2-core machine trained at 4.39 s an iteration
at torch's default of 2 threads and at 0.73 s at 1 thread, on a fifth of the CPU
(bench/busy_threads.py; docs/benchmarks.md, "One thread a process in the suite"). So every
process the tests start inherits one thread: ``OMP_NUM_THREADS`` for torch's default and
``MEGDET_POD_MILLICPUS`` for the trainer's own count (trainer/workers.py ``cpu_threads``: the
CPUs a pod asked for, which the run chart sets on every trainer container). A test that needs
the defaults gives its process its own environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from megdet.trainer.workers import POD_MILLICPUS_ENV

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

#: What each process the suite starts inherits (above); set before any test imports torch.
ONE_CPU = {"OMP_NUM_THREADS": "1", POD_MILLICPUS_ENV: "1000"}
os.environ.update(ONE_CPU)
