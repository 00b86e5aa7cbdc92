"""`megdet launch`: start torchrun for this pod and stay in between to pass signals on.

The launcher runs torchrun as a child rather than replacing itself with it so that it can print
the start-up diagnostic while torchrun starts and still be a well-behaved parent: SIGTERM (the
kubelet stopping the pod) goes to torchrun, whose agent passes it to every trainer process so
they can write a checkpoint before the grace period ends. The child's exit code becomes the
pod's, except after a forwarded signal: the rule is :mod:`megdet.signals`' (shared with
``megdet train``'s own spawning of local workers).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

from megdet.image.nccl import with_nccl_defaults
from megdet.image.topology import LaunchTopology, torchrun_arguments
from megdet.signals import FORWARDED_SIGNALS, SignalForwarder, exit_status

__all__ = [
    "FORWARDED_SIGNALS",
    "TORCHRUN_ENV_DEFAULTS",
    "exit_status",
    "run_forwarding_signals",
    "torchrun_command",
    "with_launch_defaults",
]

#: Set for torchrun when unset (the chart's or the user's value wins).
TORCHRUN_ENV_DEFAULTS: dict[str, str] = {
    # torch >= 2.5 shares the rendezvous TCPStore with the trainers and keeps it across restart
    # rounds; after one node's workers restart, keys of the previous round are read back and the
    # new process group hangs (pytorch/pytorch#135712; seen here in tests/image/
    # test_gang_restart.py: gloo waited forever in connectFullMesh). "1" gives every round a
    # fresh store, hosted by the new rank 0 worker.
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
}


def with_launch_defaults(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``env`` plus the NCCL and torchrun defaults it lacks, and the defaults that were added."""
    env, added = with_nccl_defaults(env)
    more = {k: v for k, v in TORCHRUN_ENV_DEFAULTS.items() if k not in env}
    return {**env, **more}, {**added, **more}


def torchrun_command(
    topology: LaunchTopology, megdet_args: Sequence[str], python: str = sys.executable
) -> list[str]:
    """The full command: ``python -m torch.distributed.run OPTIONS -m megdet ARGS...``."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        *torchrun_arguments(topology),
        "-m",
        "megdet",
        *megdet_args,
    ]


def run_forwarding_signals(
    cmd: Sequence[str],
    env: Mapping[str, str] | None = None,
    while_running: Callable[[], None] | None = None,
) -> int:
    """Run ``cmd``, forward FORWARDED_SIGNALS to it, and return the exit status for the pod.

    That is the child's exit status, unless a signal was forwarded: then 128 + that signal,
    whatever the child returned after checkpointing (PyTorchJob's ``ExitCode`` restart policy
    retries 128+). The child runs in its own process group (see FORWARDED_SIGNALS).
    ``while_running`` is called once the child has started (signals are forwarded meanwhile);
    an exception from it is printed and the child is still waited for.
    """
    child: subprocess.Popen[bytes] | None = None

    def targets() -> list[int]:
        return [child.pid] if child is not None and child.poll() is None else []

    with SignalForwarder(targets) as forwarder:
        child = subprocess.Popen(list(cmd), env=None if env is None else dict(env), process_group=0)
        forwarder.deliver_pending()  # a SIGTERM that arrived while the child was starting
        if while_running is not None:
            try:
                while_running()
            except Exception as err:  # the child's run matters more than this side task
                print(f"megdet launch: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return forwarder.status(child.wait())
