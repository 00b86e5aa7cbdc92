"""`megdet launch` and `megdet doctor`: the image's entrypoint and its start-up diagnostic.

Registration imports neither torch nor detectron2; the handlers import them when they run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from megdet.image.topology import EnvError, LaunchTopology, topology_from_env


def count_visible_gpus() -> int:
    """GPUs this process can use (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _topology(env: Mapping[str, str]) -> LaunchTopology:
    from megdet.cli import UsageError

    try:
        return topology_from_env(env, visible_gpus=count_visible_gpus)
    except EnvError as err:
        raise UsageError(f"bad launch environment: {err}") from None


def run_doctor(args: argparse.Namespace) -> int:
    from megdet.image.doctor import build_report, format_report

    env = dict(os.environ)
    topology = _topology(env)
    print(format_report(build_report(env, topology, args.megdet_args)))
    return 0


def run_launch(args: argparse.Namespace) -> int:
    from megdet.cli import UsageError
    from megdet.image.launcher import run_forwarding_signals, torchrun_command, with_launch_defaults
    from megdet.image.nccl_log import ECHO_ENV, LogEcho, with_fabric_log

    if not args.megdet_args:
        raise UsageError("give the megdet command to run, e.g. `megdet launch train --config X`")
    env, added = with_launch_defaults(os.environ)
    env, fabric_note = with_fabric_log(env)
    topology = _topology(env)
    cmd = torchrun_command(topology, args.megdet_args)
    if added:
        print("megdet launch: defaults added: " + " ".join(f"{k}={v}" for k, v in added.items()))
    if fabric_note:
        print(f"megdet launch: {fabric_note}")
    print(f"megdet launch: world size {topology.world_size}: {shlex.join(cmd)}", flush=True)
    if args.dry_run:
        return 0
    sys.stdout.flush()

    def doctor() -> None:
        # The diagnostic imports torch; torchrun, started first, imports it too and waits for
        # the other pods meanwhile: the report is not on the way to the first iteration.
        from megdet.image.doctor import build_report, format_report

        print(format_report(build_report(env, topology, args.megdet_args)), flush=True)

    if fabric_note is None or "NCCL_DEBUG_FILE" not in env:
        return run_forwarding_signals(cmd, env, doctor)
    # The lines the pod's NCCL_DEBUG level prints, copied from the files NCCL writes now.
    with LogEcho(Path(env["NCCL_DEBUG_FILE"]).parent, env[ECHO_ENV]):
        return run_forwarding_signals(cmd, env, doctor)


def register(subparsers: argparse._SubParsersAction) -> None:
    launch = subparsers.add_parser(
        "launch",
        help="run a megdet command under torchrun, from the PyTorchJob pod's env",
        description=(
            "The image's entrypoint. Reads the env a Kubeflow operator injects (PyTorchJob: "
            "PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT, "
            "WORLD_SIZE, RANK; TrainJob: the PET_ ones only) and the run chart's "
            "MEGDET_GRACE_PERIOD_SECONDS, MEGDET_MAX_RESTARTS and MEGDET_RUN_ID, runs "
            "`torchrun ... -m megdet ARGS` (c10d rendezvous) and prints the `megdet doctor` "
            "diagnostic while torchrun starts, passing SIGTERM on and exiting with its exit code."
        ),
    )
    launch.add_argument(
        "--dry-run",
        action="store_true",
        help="print the torchrun command and exit (no diagnostic, nothing started)",
    )
    _megdet_command(
        launch,
        run_launch,
        "the megdet command for each process, e.g. train --config megdet_R50_FPN_1x.yaml",
    )

    doctor = subparsers.add_parser(
        "doctor",
        help="show GPUs, NCCL, InfiniBand, /dev/shm, the launch topology and the plan",
        description=(
            "Start-up diagnostic for a pod: visible GPUs, NCCL version, InfiniBand devices, "
            "/dev/shm size, the NCCL env, the torchrun topology from the operator's env and "
            "the plan at that world size. Give the training command (train --config X ...) "
            "to plan with its config."
        ),
    )
    _megdet_command(doctor, run_doctor, "optional: the training command whose config to plan with")


def _megdet_command(
    parser: argparse.ArgumentParser, handler: Callable[[argparse.Namespace], int], help: str
) -> None:
    """The megdet command that ``parser``'s subcommand runs or plans with: every word after its
    own flags, as ``args.megdet_args``; ``handler`` runs the subcommand."""
    parser.add_argument("megdet_args", nargs=argparse.REMAINDER, metavar="ARGS", help=help)
    parser.set_defaults(handler=handler)
