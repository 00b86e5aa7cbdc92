"""Two "pods" on this machine: launchers with the env an operator gives node 0 and node 1.

Each launcher starts torchrun for one CPU process; the two agents meet through the c10d
rendezvous at 127.0.0.1 and train the tiny config for a few iterations on a tiny shapes
dataset, writing to one output folder as the pods share one output volume. Once with the
PyTorchJob operator's env and once with Kubeflow Trainer v2's (only the five PET_ variables).
"""

from __future__ import annotations

import json

import pytest
import torch
from pod_helpers import clean_env, free_port, operator_env, start_pod, stop, tiny_train_args

MAX_ITER = 2


@pytest.mark.slow
@pytest.mark.parametrize("target", ["pytorchjob", "trainjob"])
def test_two_pods_rendezvous_and_train(tmp_path, target):
    # A few iterations at the reference batch (2 workers x 4 images = 8).
    args, output = tiny_train_args(
        tmp_path, "SOLVER.MAX_ITER", str(MAX_ITER), "SOLVER.CHECKPOINT_PERIOD", "1000"
    )
    port = free_port()
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    pods = [
        start_pod(args, {**clean_env(), **operator_env(target, rank, port)}, log)
        for rank, log in enumerate(logs)
    ]
    try:
        codes = [pod.wait(timeout=900) for pod in pods]
    finally:
        stop(pods)
    text = [log.read_text() for log in logs]
    assert codes == [0, 0], text[0][-3000:] + text[1][-3000:]

    # Both launchers computed the global world size and met through node 0's c10d store.
    for rank in (0, 1):
        assert "megdet launch: world size 2:" in text[rank]
        assert "--nnodes=2:2 --nproc-per-node=1" in text[rank]
        assert f"--rdzv-endpoint=127.0.0.1:{port}" in text[rank]
        assert f"--rdzv-conf=is_host={int(rank == 0)}" in text[rank]
    # The trainer found a world of 2 (its plan log and plan.json) and trained to the end.
    assert "world_size: 2" in text[0] + text[1]
    plan = json.loads((output / "plan.json").read_text())
    assert (plan["world_size"], plan["nodes"], plan["global_batch"]) == (2, 2, 8)
    final = torch.load(output / "model_final.pth", map_location="cpu", weights_only=False)
    assert final["iteration"] == MAX_ITER - 1  # an uninterrupted run's last iteration
    # Both processes were ranks of that one world (detectron2 logs per rank).
    assert (output / "log.txt.rank1").is_file()
