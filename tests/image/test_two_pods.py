"""Two "pods" on this machine: launchers with the env the operator gives Master-0 and Worker-0.

Each launcher starts torchrun for one CPU process; the two meet at MASTER_ADDR 127.0.0.1 and
train the tiny config for a few iterations on a tiny shapes dataset, writing to one output
folder as the pods share one output volume.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from megdet.image.nccl import NCCL_DEFAULTS
from megdet.trainer.shapes import make_shapes

LAUNCH_VARS = (
    "MASTER_ADDR", "MASTER_PORT", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES",
    "PET_NODE_RANK", "PET_NPROC_PER_NODE", "WORLD_SIZE", "RANK", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
)  # fmt: skip


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pod_env(node_rank: int, port: int) -> dict[str, str]:
    """What the PyTorchJob operator injects with 1 Master + 1 Worker and nprocPerNode "1"."""
    base = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and k not in NCCL_DEFAULTS}
    return {
        **base,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
        "PET_NNODES": "2",
        "PET_NODE_RANK": str(node_rank),
        "PET_NPROC_PER_NODE": "1",
        "WORLD_SIZE": "2",  # pods x an integer nprocPerNode
        "RANK": str(node_rank),  # the operator's RANK is the node rank
    }


@pytest.mark.slow
def test_master_and_worker_pods_rendezvous_and_train(tmp_path):
    data = make_shapes(tmp_path / "data", train=16, val=0, seed=0)
    output = tmp_path / "output"
    args = [
        "train", "--config", "megdet_tiny_cpu.yaml", "--output", str(output),
        "--train-json", str(data["train_json"]), "--train-images", str(data["train_images"]),
        # A few iterations at the reference batch (2 workers x 4 images = 8).
        "SOLVER.MAX_ITER", "2", "SOLVER.STEPS", "()", "SOLVER.WARMUP_ITERS", "1",
        "SOLVER.CHECKPOINT_PERIOD", "1000",
    ]  # fmt: skip
    port = free_port()
    logs = {name: tmp_path / f"{name}.log" for name in ("master", "worker")}
    pods = {}
    for rank, name in enumerate(logs):
        with logs[name].open("w") as log:
            pods[name] = subprocess.Popen(
                [sys.executable, "-m", "megdet", "launch", *args],
                env=pod_env(rank, port),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    try:
        codes = {name: pod.wait(timeout=900) for name, pod in pods.items()}
    finally:
        for pod in pods.values():
            if pod.poll() is None:
                pod.kill()
    text = {name: path.read_text() for name, path in logs.items()}
    assert codes == {"master": 0, "worker": 0}, text["master"][-3000:] + text["worker"][-3000:]

    # Both launchers computed the global world size and ran torchrun as nodes 0 and 1.
    for rank, name in enumerate(logs):
        assert "megdet launch: world size 2:" in text[name]
        assert f"--nnodes=2 --nproc-per-node=1 --node-rank={rank}" in text[name]
    # The trainer found a world of 2 (its plan log and plan.json) and trained to the end.
    assert "world_size: 2" in text["master"]
    plan = json.loads((output / "plan.json").read_text())
    assert (plan["world_size"], plan["nodes"], plan["global_batch"]) == (2, 2, 8)
    assert (output / "model_final.pth").is_file()
    # The worker pod's process was rank 1 of that world (detectron2 logs per rank).
    assert (output / "log.txt.rank1").is_file()
