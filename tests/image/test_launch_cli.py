"""`megdet launch` from the command line: the command it would run, and its errors."""

from __future__ import annotations

import subprocess
import sys

from pod_helpers import megdet

from megdet.image.nccl import NCCL_DEFAULTS, nccl_env, with_nccl_defaults


def test_dry_run_prints_the_torchrun_command_for_worker_0():
    # Worker-0 of a 3-pod job with nprocPerNode "4": node rank 1, global world 12.
    env = {
        "MASTER_ADDR": "job-master-0",
        "MASTER_PORT": "23456",
        "PET_NNODES": "3",
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "4",
        "WORLD_SIZE": "12",
        "RANK": "1",
    }
    args = ["train", "--config", "x.yaml", "SOLVER.MAX_ITER", "5"]
    result = megdet("launch", "--dry-run", *args, env=env)
    assert result.returncode == 0, result.stderr
    assert "world size 12" in result.stdout
    assert (
        "-m torch.distributed.run --nnodes=3:3 --nproc-per-node=4 --max-restarts=0 "
        "--rdzv-backend=c10d --rdzv-endpoint=job-master-0:23456 --rdzv-id=megdet "
        "--rdzv-conf=is_host=0 -m megdet train --config x.yaml SOLVER.MAX_ITER 5"
    ) in result.stdout
    assert "defaults added: NCCL_DEBUG=WARN TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in result.stdout


def test_a_chart_set_nccl_variable_is_never_overridden():
    chart_env = {"NCCL_DEBUG": "INFO", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}
    result = megdet("launch", "--dry-run", "train", env=chart_env)
    assert result.returncode == 0, result.stderr
    assert "defaults added" not in result.stdout
    env, added = with_nccl_defaults({"NCCL_DEBUG": "INFO", "PATH": "/bin"})
    assert env["NCCL_DEBUG"] == "INFO" and added == {}
    env, added = with_nccl_defaults({"PATH": "/bin"})
    assert added == NCCL_DEFAULTS and nccl_env(env) == NCCL_DEFAULTS


def test_launch_with_malformed_env_exits_2_naming_the_variable():
    env = {"PET_NNODES": "2", "PET_NODE_RANK": "5", "MASTER_ADDR": "m"}
    result = megdet("launch", "--dry-run", "train", env=env)
    assert result.returncode == 2
    assert "PET_NODE_RANK: 5 must be below PET_NNODES (2)" in result.stderr
    assert "Traceback" not in result.stderr


def test_launch_refuses_a_cpu_request_the_workers_cannot_read_before_torchrun_starts():
    # Each torchrun worker would otherwise fail alone with the same ConfigError.
    result = megdet("launch", "--dry-run", "train", env={"MEGDET_POD_MILLICPUS": "2cpu"})
    assert result.returncode == 2
    assert "MEGDET_POD_MILLICPUS: '2cpu' is not a whole number" in result.stderr
    assert "torchrun" not in result.stdout and "Traceback" not in result.stderr


def test_launch_without_a_command_is_a_usage_error():
    result = megdet("launch")
    assert result.returncode == 2
    assert "give the megdet command to run" in result.stderr


def test_launch_fails_when_the_command_fails():
    # A real torchrun run (standalone, one process) of a megdet command that fails on bad
    # input: the pod fails (torchrun reports any worker failure as 1) with the child's message.
    result = megdet("launch", "plan", "--gpus", "0", env={"PET_NPROC_PER_NODE": "1"})
    assert result.returncode == 1
    assert "megdet doctor" in result.stdout  # the start-up diagnostic ran beside torchrun
    assert "gpus" in result.stderr


def test_registration_does_not_import_torch():
    code = (
        "import argparse, sys; from megdet.image import cli; "
        "p = argparse.ArgumentParser(); cli.register(p.add_subparsers()); "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
