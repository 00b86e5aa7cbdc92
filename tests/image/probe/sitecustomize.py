"""A test probe loaded into every Python process of a test "pod" (PYTHONPATH=this folder).

Python imports ``sitecustomize`` at start-up; this one acts only in trainer processes that
torchrun started (TORCHELASTIC_RUN_ID) and only when a test asks, through env variables:

- ``MEGDET_PROBE_DIR``: append "<restart> <iteration> <pid>" to ``steps.rank<RANK>.txt`` there
  after every completed training step (what iterations each attempt ran, and whom to kill);
- ``MEGDET_PROBE_HOLD``: "<rank>:<iteration>": once per run (a ``held`` marker file in the
  probe folder), that rank stops after that iteration (sleeping) so the test can SIGKILL it at
  a known point instead of racing the loop. A marker, not TORCHELASTIC_RESTART_COUNT: an agent
  that restarts its workers for a membership change keeps its count at 0;
- ``MEGDET_PROBE_SLOW_SAVE``: seconds every checkpoint save sleeps first (a slow volume).

It wraps megdet's own trainer and checkpointer methods; nothing in the product reads these
variables.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _install() -> None:
    from megdet.trainer import checkpoint, engine

    probe_dir = os.environ.get("MEGDET_PROBE_DIR")
    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    hold_rank, _, hold_iter = os.environ.get("MEGDET_PROBE_HOLD", "-1:-1").partition(":")
    slow_save = float(os.environ.get("MEGDET_PROBE_SLOW_SAVE", "0"))

    run_step = engine.MegDetTrainer.run_step

    def recorded_run_step(self):
        run_step(self)
        if probe_dir:
            with open(Path(probe_dir) / f"steps.rank{rank}.txt", "a") as f:
                f.write(f"{restart} {self.iter} {os.getpid()}\n")
        if rank == int(hold_rank) and self.iter == int(hold_iter) and probe_dir:
            marker = Path(probe_dir) / "held"
            if not marker.exists():
                tmp = marker.with_suffix(".tmp")
                tmp.write_text(str(os.getpid()))
                os.replace(tmp, marker)  # appears with its content
                time.sleep(600)  # until the test kills this process

    engine.MegDetTrainer.run_step = recorded_run_step

    if slow_save:
        save = checkpoint.AtomicCheckpointer.save

        def slow(self, name, **kwargs):
            time.sleep(slow_save)
            return save(self, name, **kwargs)

        checkpoint.AtomicCheckpointer.save = slow


if os.environ.get("TORCHELASTIC_RUN_ID") and any(
    os.environ.get(k) for k in ("MEGDET_PROBE_DIR", "MEGDET_PROBE_SLOW_SAVE")
):
    _install()
