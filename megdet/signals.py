"""Passing a pod's stop signal on to child processes, and the exit status a parent reports.

One owner for the rule both parents follow: ``megdet launch`` (one torchrun child) and
``megdet train --num-workers N`` (N spawned trainer processes). Standard library only.

The rule: SIGTERM, SIGINT and SIGHUP received by the parent go to every live child; the parent
waits for them (they save a checkpoint) and then exits ``128 + the first signal``, whatever the
children returned. A stopped pod thus reads as interrupted, never as finished (0) nor as a
permanent failure (torchrun exits 1 on SIGTERM). Without a signal, the parent exits with the
child's status, ``128 + N`` for a child killed by signal N, as a shell reports it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType

__all__ = ["FORWARDED_SIGNALS", "SignalForwarder", "exit_status"]

#: Signals passed on. SIGINT too, because children run in their own process group (so a
#: terminal's Ctrl-C reaches them once, through the parent, not twice).
FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def exit_status(returncode: int) -> int:
    """A child's return code as a shell would report it (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


class SignalForwarder:
    """Context manager: while active, FORWARDED_SIGNALS go to the pids ``targets()`` returns.

    A signal that arrives while ``targets()`` is empty (the child is still being started) is
    kept; :meth:`deliver_pending` sends it once the child exists, so it is never lost.
    """

    def __init__(
        self,
        targets: Callable[[], Iterable[int]],
        signals: tuple[signal.Signals, ...] = FORWARDED_SIGNALS,
    ) -> None:
        self._targets = targets
        self._signals = signals
        self._previous: dict[int, object] = {}
        #: every signal received, in order
        self.received: list[int] = []
        self._pending: list[int] = []

    def _send(self, signum: int) -> bool:
        sent = False
        for pid in self._targets():
            try:
                os.kill(pid, signum)
                sent = True
            except ProcessLookupError:  # it exited meanwhile: nothing left to stop
                pass
        return sent

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)
        if not self._send(signum):
            self._pending.append(signum)

    def deliver_pending(self) -> None:
        """Send the signals that arrived before there was anyone to send them to."""
        while self._pending:
            self._send(self._pending.pop(0))

    def status(self, returncode: int) -> int:
        """The parent's exit status for a child that returned ``returncode`` (see module doc)."""
        return 128 + self.received[0] if self.received else exit_status(returncode)

    def __enter__(self) -> SignalForwarder:
        self._previous = {sig: signal.signal(sig, self._forward) for sig in self._signals}
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
