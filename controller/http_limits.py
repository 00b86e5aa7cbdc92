"""Bounded HTTP serving for the controller's two servers (``/metrics`` and the progress endpoint):
what each limit is and why, docs/operations.md, "Limits: nothing a pod can send takes the
controller down".
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import ssl
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "REFUSALS",
    "BoundedHandlerMixin",
    "BoundedServerMixin",
    "ConnectionGate",
    "Limits",
]

#: Why a connection was cut (the ``reason`` label of ``megdet_controller_http_refused_total``):
#: over a connection cap, evicted for a newcomer, or past its deadline.
REFUSALS = ("busy", "evicted", "deadline")

_log = logging.getLogger(__name__)

_BUSY_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n"
    b"Content-Length: 27\r\nConnection: close\r\n\r\ntoo many connections, retry"
)


@dataclass(frozen=True)
class Limits:
    """What one server allows. The defaults fit the controller's 1 Gi limit with room."""

    #: Connections served at once, in all (then the oldest unfinished request makes room).
    max_connections: int = 128
    #: Connections served at once from one source address.
    per_source: int = 8
    #: Seconds for the handshake and the whole request (line, headers, body) to arrive.
    request_timeout: float = 10.0
    #: Seconds for the answer to be taken by the client.
    write_timeout: float = 10.0
    #: Bytes one request may send in all (request line, headers and body).
    max_request_bytes: int = 128 * 1024

    def __post_init__(self) -> None:
        for name in ("max_connections", "per_source", "max_request_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("request_timeout", "write_timeout"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a number of seconds > 0, got {value}")


@dataclass(slots=True)
class _Place:
    source: str
    sock: Any
    settled: bool = False  # its request is in: no longer evicted for a newcomer


class ConnectionGate:
    """The connections being served, in all and by source, oldest first; at the cap a newcomer
    takes the place of the oldest whose request has not arrived (:meth:`settle`). Thread-safe."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._places: OrderedDict[int, _Place] = OrderedDict()

    def enter(self, source: str, sock: Any = None) -> tuple[bool, Any]:
        """Take a place for ``sock`` from ``source``: (whether it got one, the socket evicted)."""
        with self._lock:
            if sum(p.source == source for p in self._places.values()) >= self.limits.per_source:
                return False, None
            evicted = None
            if len(self._places) >= self.limits.max_connections:
                oldest = next((k for k, p in self._places.items() if not p.settled), None)
                if oldest is None:
                    return False, None
                evicted = self._places.pop(oldest).sock
            self._places[id(sock)] = _Place(source, sock)
            return True, evicted

    def settle(self, sock: Any, settled: bool = True) -> None:
        """``sock``'s request has arrived (``settled=False``: the next one is being read)."""
        with self._lock:
            place = self._places.get(id(sock))
            if place is not None and place.sock is sock:
                place.settled = settled
                if not settled:
                    self._places.move_to_end(id(sock))

    def leave(self, sock: Any) -> None:
        with self._lock:
            place = self._places.get(id(sock))
            if place is not None and place.sock is sock:
                del self._places[id(sock)]

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._places)

    def sources(self) -> int:
        with self._lock:
            return len({p.source for p in self._places.values()})


class _DeadlineSocket(io.RawIOBase):
    """A connection whose reads get what is left of the request's deadline and byte budget
    (then end of file), and whose writes ``sendall`` within ``write_timeout`` for the whole
    answer (CPython's sendall timeout is a deadline for the call); :meth:`reset` per request."""

    def __init__(
        self,
        sock: socket.socket,
        limits: Limits,
        clock: Callable[[], float],
        on_expired: Callable[[], None],
    ) -> None:
        self._sock = sock
        self.limits = limits
        self.clock = clock
        self.on_expired = on_expired
        self.reset()

    def reset(self) -> None:
        self.at = self.clock() + self.limits.request_timeout
        self.budget = self.limits.max_request_bytes
        self.expired = False

    def remaining(self) -> float:
        left = self.at - self.clock()
        if left <= 0:
            if not self.expired:
                self.expired = True
                self.on_expired()
            raise TimeoutError("request deadline passed")
        return left

    def timed(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` on the socket within what is left of the deadline."""
        self._sock.settimeout(self.remaining())
        try:
            return call(*args)
        except TimeoutError:
            self.remaining()  # counts it once the deadline has passed
            raise

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.budget)
        if want <= 0:
            return 0
        got = self.timed(self._sock.recv_into, memoryview(buffer)[:want])
        self.budget -= got
        return got

    def write(self, data: Any) -> int:
        self._sock.settimeout(self.limits.write_timeout)
        self._sock.sendall(data)
        with memoryview(data) as view:
            return view.nbytes


class BoundedServerMixin:
    """Put before ``ThreadingMixIn`` in the bases; call :meth:`init_limits` before serving."""

    request_queue_size = 128  # the kernel's accept queue; the accept loop drains it quickly
    limits: Limits
    gate: ConnectionGate
    #: Called with a :data:`REFUSALS` reason for each connection refused or cut.
    on_refused: Callable[[str], None]
    clock: Callable[[], float]

    def init_limits(
        self,
        limits: Limits | None,
        on_refused: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits or Limits()
        self.gate = ConnectionGate(self.limits)
        self.on_refused = on_refused
        self.deadline_clock = clock

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-handshake, speaks plain HTTP to HTTPS or is cut: no traceback.
        _log.debug("connection from %s failed: %s", client_address, sys.exc_info()[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        source = str(client_address[0]) if client_address else ""
        admitted, evicted = self.gate.enter(source, request)
        if evicted is not None:
            self.on_refused("evicted")
            _cut(evicted)
        if not admitted:
            self.on_refused("busy")
            _refuse(request)
            return
        try:
            super().process_request(request, client_address)  # type: ignore[misc]
        except BaseException:
            self.gate.leave(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self.gate.leave(request)


def _cut(sock: Any) -> None:
    """End a connection another thread is reading (the plain socket's shutdown, not TLS's)."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _refuse(request: Any) -> None:
    """Close an over-the-cap connection without waiting for anything from it."""
    try:
        if not isinstance(request, ssl.SSLSocket):
            request.setblocking(False)
            request.send(_BUSY_ANSWER)
            request.recv(65536)  # what already came, so that closing does not reset the answer
    except OSError:
        pass
    with contextlib.suppress(OSError):
        request.close()


class BoundedHandlerMixin:
    """Put before the ``StreamRequestHandler`` subclass in a handler's bases: the TLS handshake,
    reads and writes within the request's deadline; :meth:`next_request` starts the next's."""

    server: Any
    request: Any
    connection: Any
    rbufsize = io.DEFAULT_BUFFER_SIZE

    def setup(self) -> None:
        self.connection = self.request
        self.deadline = _DeadlineSocket(
            self.connection,
            self.server.limits,
            self.server.deadline_clock,
            lambda: self.server.on_refused("deadline"),
        )
        if isinstance(self.connection, ssl.SSLSocket):  # here, so a slow client blocks no other
            self.deadline.timed(self.connection.do_handshake)
        self.wfile = self.deadline
        self.rfile = io.BufferedReader(self.wfile, self.rbufsize)

    def parse_request(self) -> bool:
        ok = super().parse_request()  # type: ignore[misc]
        if ok:
            self.server.gate.settle(self.request)  # its request line and headers are in
        return ok

    def next_request(self) -> None:
        self.deadline.reset()
        self.server.gate.settle(self.request, settled=False)
