"""A pod being stopped: SIGTERM to `megdet launch` reaches the trainer through torchrun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from megdet.image.nccl import NCCL_DEFAULTS
from megdet.trainer.shapes import make_shapes

LAUNCH_VARS = (
    "MASTER_ADDR", "MASTER_PORT", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES",
    "PET_NODE_RANK", "PET_NPROC_PER_NODE", "WORLD_SIZE", "RANK", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
)  # fmt: skip


@pytest.mark.slow
def test_sigterm_to_the_launcher_makes_the_trainer_checkpoint_and_the_pod_exit_143(tmp_path):
    data = make_shapes(tmp_path / "data", train=16, val=0, seed=0)
    output = tmp_path / "output"
    args = [
        "train", "--config", "megdet_tiny_cpu.yaml", "--output", str(output),
        "--train-json", str(data["train_json"]), "--train-images", str(data["train_images"]),
        "SOLVER.CHECKPOINT_PERIOD", "100000",  # only the SIGTERM checkpoint can appear
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and k not in NCCL_DEFAULTS}
    log_path = tmp_path / "pod.log"
    with log_path.open("w") as log:
        pod = subprocess.Popen(
            [sys.executable, "-m", "megdet", "launch", *args],
            env={**env, "PET_NPROC_PER_NODE": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 600
        # Wait until the loop is running (the first iteration's metrics are logged at iter 0+).
        while "Starting training from iteration 0" not in log_path.read_text():
            assert pod.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.5)
        pod.send_signal(signal.SIGTERM)  # what the kubelet does to the container's PID 1 child
        code = pod.wait(timeout=300)
    finally:
        if pod.poll() is None:
            pod.kill()
    text = log_path.read_text()
    assert code == 128 + signal.SIGTERM, text[-3000:]
    assert "after SIGTERM" in text  # the trainer's own message: it saved a checkpoint
    assert (output / "last_checkpoint").is_file()
    saved = (output / "last_checkpoint").read_text().strip()
    assert (output / saved).is_file()
