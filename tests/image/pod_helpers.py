"""Local stand-ins for a job's pods: `megdet launch` processes with an operator's env.

Each "pod" is a `megdet launch` process (the image's entrypoint) with the env that a Kubeflow
operator and the run chart give one pod; its torchrun agents meet at 127.0.0.1. Used by the
two-pod, gang-restart and SIGTERM tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cluster.control_plane import free_port as free_port  # for the pod tests
from megdet.image.nccl import NCCL_DEFAULTS
from megdet.trainer.shapes import make_shapes

#: Variables a test must not inherit from the shell that runs it.
LAUNCH_VARS = (
    "MASTER_ADDR", "MASTER_PORT", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES",
    "PET_NODE_RANK", "PET_NPROC_PER_NODE", "WORLD_SIZE", "RANK", "LOCAL_RANK",
    "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MEGDET_GRACE_PERIOD_SECONDS",
    "MEGDET_MAX_RESTARTS", "MEGDET_RUN_ID", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
)  # fmt: skip
#: The sitecustomize probe (tests/image/probe): step records, a hold point, a slow save.
PROBE = Path(__file__).parent / "probe"


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and k not in NCCL_DEFAULTS}


def megdet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m megdet ARGS`` with a clean env plus ``env``; output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "megdet", *args],
        env={**clean_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def operator_env(target: str, node_rank: int, port: int, nnodes: int = 2) -> dict[str, str]:
    """What the operator injects into pod ``node_rank`` with nprocPerNode 1.

    pytorchjob: kubeflow/trainer v1.9.4 pkg/controller.v1/pytorch/envvar.go (WORLD_SIZE is
    pods x an integer nprocPerNode; RANK is the node rank). trainjob: Trainer v2.3.0
    pkg/runtime/framework/plugins/torch/torch.go, only the five PET_ variables.
    """
    pet = {
        "PET_NNODES": str(nnodes),
        "PET_NODE_RANK": str(node_rank),
        "PET_NPROC_PER_NODE": "1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
    }
    if target == "trainjob":
        return pet
    assert target == "pytorchjob", target
    return {
        **pet,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nnodes),
        "RANK": str(node_rank),
    }


def tiny_train_args(tmp_path: Path, *overrides: str) -> tuple[list[str], Path]:
    """`train` arguments for the tiny config on a 16-image shapes set, and the output folder."""
    data = make_shapes(tmp_path / "data", train=16, val=0, seed=0)
    output = tmp_path / "output"
    args = [
        "train", "--config", "megdet_tiny_cpu.yaml", "--output", str(output),
        "--train-json", str(data["train_json"]), "--train-images", str(data["train_images"]),
        "SOLVER.STEPS", "()", "SOLVER.WARMUP_ITERS", "1", *overrides,
    ]  # fmt: skip
    return args, output


def start_pod(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "megdet", "launch", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def with_probe(env: dict[str, str], **settings: str) -> dict[str, str]:
    """``env`` with the probe on PYTHONPATH and its MEGDET_PROBE_* settings."""
    path = os.pathsep.join(filter(None, [str(PROBE), env.get("PYTHONPATH", "")]))
    return {**env, "PYTHONPATH": path, **settings}


def wait_for(condition: Callable[[], bool], pods: list[subprocess.Popen], what: str, timeout=600):
    """Poll ``condition`` until true; fail if a pod exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        for pod in pods:
            assert pod.poll() is None, f"a pod exited ({pod.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def stop(pods: list[subprocess.Popen]) -> None:
    for pod in pods:
        if pod.poll() is None:
            pod.kill()
            pod.wait()


def read_steps(probe_dir: Path, rank: int) -> list[tuple[int, int, int]]:
    """(restart, iteration, pid) per completed step of one rank, in order."""
    path = probe_dir / f"steps.rank{rank}.txt"
    if not path.exists():
        return []
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines() if line]
