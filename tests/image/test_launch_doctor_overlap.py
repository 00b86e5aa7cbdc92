"""`megdet launch` starts torchrun first and prints its diagnostic while torchrun starts: the
report's torch import is not on the way to the first iteration (docs/benchmarks.md, "Time to
the first iteration on the real node")."""

from __future__ import annotations

import argparse
import os
import sys

from megdet.image import cli, launcher


def test_the_side_task_runs_while_the_child_runs(tmp_path) -> None:
    gate = tmp_path / "gate"
    # The child waits for the side task's file: it can only end after the side task ran.
    child = (
        "import os, sys, time\n"
        "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
        "sys.exit(3)\n"
    )
    seen = []

    def side_task() -> None:
        seen.append("ran")
        gate.write_text("go")

    status = launcher.run_forwarding_signals(
        [sys.executable, "-c", child, str(gate)], None, side_task
    )
    assert seen == ["ran"] and status == 3


def test_a_failing_side_task_leaves_the_child_running(tmp_path, capsys) -> None:
    def side_task() -> None:
        raise RuntimeError("no report")

    status = launcher.run_forwarding_signals(
        [sys.executable, "-c", "import time; time.sleep(0.2)"], None, side_task
    )
    assert status == 0
    assert "megdet launch: RuntimeError: no report" in capsys.readouterr().err


def test_launch_starts_torchrun_before_the_diagnostic(monkeypatch, capsys) -> None:
    order = []
    monkeypatch.setenv("PET_NPROC_PER_NODE", "1")
    monkeypatch.setattr(cli, "count_visible_gpus", lambda: 0)
    monkeypatch.setattr("megdet.image.nccl_log.with_fabric_log", lambda env: (env, None))

    def build_report(*args):
        order.append("diagnostic")

    monkeypatch.setattr("megdet.image.doctor.build_report", build_report)
    monkeypatch.setattr("megdet.image.doctor.format_report", lambda report: "(doctor report)")

    def fake_child(cmd, env, while_running=None):
        order.append("torchrun " + os.path.basename(cmd[0]))
        while_running()
        return 0

    monkeypatch.setattr(launcher, "run_forwarding_signals", fake_child)
    assert cli.run_launch(argparse.Namespace(megdet_args=["train"], dry_run=False)) == 0
    assert order[0].startswith("torchrun ") and order[1:] == ["diagnostic"]
    out = capsys.readouterr().out
    assert out.index("megdet launch: world size 1") < out.index("(doctor report)")
