"""`megdet launch`: start torchrun for this pod and stay in between to pass signals on.

The launcher runs torchrun as a child rather than replacing itself with it so that it can print
the start-up diagnostic first and still be a well-behaved parent: SIGTERM (the kubelet stopping
the pod) goes to torchrun, whose agent passes it to every trainer process so they can write a
checkpoint before the grace period ends. The child's exit code becomes the pod's, except after a
forwarded signal (see :func:`run_forwarding_signals`).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from types import FrameType

from megdet.image.topology import LaunchTopology, torchrun_arguments

__all__ = ["FORWARDED_SIGNALS", "run_forwarding_signals", "torchrun_command"]

#: Signals passed on to the child. SIGINT too, because the child runs in its own process group
#: (so a terminal's Ctrl-C reaches it once, through us, not twice).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


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


def exit_status(returncode: int) -> int:
    """A child's return code as a shell would report it (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def run_forwarding_signals(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run ``cmd``, forward FORWARDED_SIGNALS to it, and return the exit status for the pod.

    That is the child's exit status, unless a signal was forwarded: then 128 + that signal
    (what a process killed by it reports), whatever the child returned after checkpointing.
    A stopped pod thus reads as interrupted, never as finished (0) nor as a permanent failure
    (torchrun exits 1 on SIGTERM); PyTorchJob's ``ExitCode`` restart policy retries 128+.
    """
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []
    received: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if child is None:
            pending.append(signum)  # arrived while the child was starting
        elif child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        child = subprocess.Popen(list(cmd), env=None if env is None else dict(env), process_group=0)
        for signum in pending:
            child.send_signal(signum)
        status = exit_status(child.wait())
        return 128 + received[0] if received else status
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
