"""One dead trainer process restarts the whole world, which resumes from the last checkpoint.

Two "pods" (launchers with the PyTorchJob env and MEGDET_MAX_RESTARTS=1, as the run chart sets
from ``workerRestarts``). Mid-run, the global rank 1 process is SIGKILLed (an OOM kill, a
segfault). Its torchrun agent restarts its workers and re-enters the c10d rendezvous; the other
agent's worker fails on its next collective (or its agent sees a node waiting) and restarts
too. Both new workers resume from the last complete checkpoint and the run finishes with the
same final iteration as an uninterrupted run (test_two_pods.py checks that one).

The probe (tests/image/probe) records every completed step per rank and attempt, and holds rank
1 after iteration HOLD_AT of the first attempt so the kill lands at a known point.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from pod_helpers import (
    clean_env,
    free_port,
    operator_env,
    read_steps,
    start_pod,
    stop,
    tiny_train_args,
    wait_for,
    with_probe,
)

MAX_ITER = 5
CHECKPOINT_PERIOD = 2  # checkpoints after iterations 1 and 3 (detectron2 saves at (i+1) % 2 == 0)
HOLD_AT = 2  # killed after iteration 2: the last complete checkpoint is iteration 1's


@pytest.mark.slow
def test_a_killed_worker_restarts_the_gang_which_resumes_and_finishes(tmp_path):
    args, output = tiny_train_args(
        tmp_path,
        "SOLVER.MAX_ITER", str(MAX_ITER), "SOLVER.CHECKPOINT_PERIOD", str(CHECKPOINT_PERIOD),
    )  # fmt: skip
    probe = tmp_path / "probe"
    probe.mkdir()
    port = free_port()
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    pods = []
    try:
        for rank, log in enumerate(logs):
            env = {**clean_env(), **operator_env("pytorchjob", rank, port)}
            env = with_probe(
                {**env, "MEGDET_MAX_RESTARTS": "1", "MEGDET_RUN_ID": "gang"},
                MEGDET_PROBE_DIR=str(probe),
                MEGDET_PROBE_HOLD=f"1:{HOLD_AT}",
            )
            pods.append(start_pod(args, env, log))
        wait_for((probe / "held").exists, pods, "the hold point")
        victim = int((probe / "held").read_text())
        os.kill(victim, signal.SIGKILL)
        codes = [pod.wait(timeout=900) for pod in pods]
    finally:
        stop(pods)
    text = [log.read_text() for log in logs]
    assert codes == [0, 0], text[0][-3000:] + text[1][-3000:]

    steps = {rank: read_steps(probe, rank) for rank in (0, 1)}
    for rank in (0, 1):
        # Every rank ran in two processes: the whole world restarted, not just the dead one.
        # (By pid: TORCHELASTIC_RESTART_COUNT stays 0 on an agent that restarted its workers
        # for the membership change rather than for a failure of its own.)
        pids = list(dict.fromkeys(pid for _, _, pid in steps[rank]))
        assert len(pids) == 2, (rank, steps[rank])
        second = [it for _, it, pid in steps[rank] if pid == pids[1]]
        # It resumed from the last complete checkpoint (iteration 1 -> starts at 2) and ran on
        # to the end without gaps.
        assert second == list(range(CHECKPOINT_PERIOD, MAX_ITER)), (rank, second)
    # Each agent tags its workers with TORCHELASTIC_RESTART_COUNT: (first, second) attempt.
    counts = {rank: [restart for restart, _ in dict.fromkeys(
        (restart, pid) for restart, _, pid in steps[rank])] for rank in (0, 1)}  # fmt: skip
    assert [first for first, _ in counts.values()] == [0, 0], steps
    second_attempt = sorted(second for _, second in counts.values())

    first = [it for _, it, pid in steps[0] if pid == steps[0][0][2]]
    resumed_at = next(it for _, it, pid in steps[0] if pid != steps[0][0][2])
    lost = max(first) + 1 - resumed_at
    print(f"gang restart: first attempt reached iteration {max(first)}, resumed at {resumed_at}: "
          f"{lost} iteration(s) lost (checkpoint period {CHECKPOINT_PERIOD})")  # fmt: skip
    assert 1 <= lost <= CHECKPOINT_PERIOD

    assert "Starting training from iteration 2" in text[0] + text[1]
    assert f"model_{CHECKPOINT_PERIOD - 1:07d}.pth" in text[0] + text[1]  # the checkpoint loaded
    final = torch.load(output / "model_final.pth", map_location="cpu", weights_only=False)
    assert final["iteration"] == MAX_ITER - 1  # what an uninterrupted run ends with
    # The agents' own account. One saw its worker die of SIGKILL; that failure is counted against
    # its restart budget. The other agent's worker was healthy, and one of two things stops it,
    # whichever comes first (both are a whole-gang restart; both happen on real clusters):
    #  a. its agent notices the dead agent re-entering the rendezvous (num_nodes_waiting > 0) and
    #     stops the worker with SIGTERM. Membership changes are not counted as restarts
    #     (torch/distributed/elastic/agent/server/api.py, _invoke_run).
    #  b. the worker's next gloo collective fails first and it exits 1; its agent counts that as
    #     a failure and restarts too. gloo says "Connection closed by peer" when the dead
    #     worker's socket closed cleanly, "Connection reset by peer" when the kernel reset it
    #     (the killed process left unread data: both seen here, gloo's tcp/pair.cc read error).
    victim_logs = [log for log in text if "failed (exitcode: -9)" in log]
    assert len(victim_logs) == 1, [log[-2000:] for log in text]
    healthy = text[1 - text.index(victim_logs[0])]
    stopped_by_agent = "closing signal SIGTERM" in healthy
    failed_collective = "failed (exitcode: 1)" in healthy and (
        "Connection closed by peer" in healthy or "Connection reset by peer" in healthy
    )
    how = "stopped by its agent (SIGTERM)" if stopped_by_agent else "failed by its collective"
    print(f"gang restart: the healthy worker was {how}")
    assert stopped_by_agent != failed_collective, healthy[-3000:]
    assert second_attempt == ([0, 1] if stopped_by_agent else [1, 1]), steps
