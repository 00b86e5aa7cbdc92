"""The controller's Prometheus metrics (``megdet_controller_*``) in :data:`REGISTRY`, and the
/metrics server (:func:`serve`). The names are a contract with the dashboards and alerts in
charts/megdet-operator: change them only together. Each series: docs/monitoring.md, "What is
exported".
"""

from __future__ import annotations

import collections
import logging
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from megdet.controller.http_limits import BoundedHandlerMixin, BoundedServerMixin, Limits
from megdet.controller.job_state import PHASES  # the ``phase`` label's values of RUNS

_log = logging.getLogger(__name__)

__all__ = [
    "HTTP_REFUSED",
    "JOBS_CREATED",
    "JOBS_DELETED",
    "JOBS_FAILED",
    "JOBS_RESTARTED",
    "JOBS_SUCCESSFUL",
    "PROGRESS_REPORTS",
    "PROGRESS_WRITES",
    "RECONCILES",
    "RECONCILE_DURATION",
    "REGISTRY",
    "RUNS",
    "RUN_INFO",
    "STARTUP",
    "MetricsServer",
    "forget_run",
    "record_run_info",
    "sample",
    "serve",
    "server_ssl_context",
    "set_run_phases",
]

#: Every collector (a private registry: no cross-talk in tests); `serve` exposes exactly this.
REGISTRY = CollectorRegistry()
RECONCILES = Counter(
    "megdet_controller_reconciles",
    "MegDetRun reconciles by result: success, invalid (spec refused), denied (outside the "
    "cluster's MegDet policy), error (retried), "
    "conflict (the job's name, or the run's output folder, is taken; retried), refused (the "
    "API server refused the job for good: schema, an admission webhook's or policy's verdict; "
    "not retried until the spec changes; a refusal that heals, such as a quota without room, "
    "is retried and counted as error).",
    ["result"],
    registry=REGISTRY,
)
RECONCILE_DURATION = Histogram(
    "megdet_controller_reconcile_duration_seconds",
    "Time to reconcile one MegDetRun: render, create or look up the job, write status.",
    # Reconciles are API round trips plus an in-process Helm render: milliseconds to seconds.
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
RUN_READS = Counter(
    "megdet_controller_run_reads",
    "MegDetRuns read for a status write, by source: watch (the run's watch, or the answer to "
    "this controller's last write of it: no request), server (the API server: no view of the "
    "run yet), stale (a view the API server refused with 409 because the run had changed "
    "since: read again from the server, counted there too).",
    ["source"],
    registry=REGISTRY,
)
for _source in ("watch", "server", "stale"):
    RUN_READS.labels(_source)
RUNS = Gauge(
    "megdet_controller_runs",
    "MegDetRuns this controller has seen, by namespace and status phase.",
    ["namespace", "phase"],
    registry=REGISTRY,
)


def _job_counter(name: str, documentation: str) -> Counter:
    """A counter of the runs' jobs, by the run's namespace and its target (the job's kind)."""
    return Counter(name, documentation, ["namespace", "target"], registry=REGISTRY)


JOBS_CREATED = _job_counter(
    "megdet_controller_jobs_created", "Jobs (PyTorchJob or TrainJob) created for MegDetRuns."
)
JOBS_DELETED = _job_counter(
    "megdet_controller_jobs_deleted",
    "Jobs owned by MegDetRuns that were deleted: with their run, or on their own (the training "
    "operator's TTL after finishing, or by hand; the run then says JobPresent=False).",
)
JOBS_SUCCESSFUL = _job_counter(
    "megdet_controller_jobs_successful", "Jobs owned by MegDetRuns that succeeded."
)
JOBS_FAILED = _job_counter("megdet_controller_jobs_failed", "Jobs owned by MegDetRuns that failed.")
JOBS_RESTARTED = _job_counter(
    "megdet_controller_jobs_restarted",
    "Times a job owned by a MegDetRun entered its Restarting condition.",
)
RUN_INFO = Gauge(
    "megdet_controller_run_info",
    "One series per planned MegDetRun (value 1) carrying its plan: world size, global batch, LR.",
    ["namespace", "run", "target", "world_size", "global_batch", "lr"],
    registry=REGISTRY,
)
#: Training progress reports to the controller's endpoint (target pytorchjob; progress.py), by
#: result: accepted, unauthenticated (no token), forbidden (a token not of the run's pods),
#: invalid (422/411/413), not_found (no such run, or target trainjob), busy (503: the hub holds
#: its most runs), error (API failure, the issuer's keys unreadable).
PROGRESS_REPORTS = Counter(
    "megdet_controller_progress_reports",
    "Progress reports POSTed to the controller's status endpoint, by result.",
    ["result"],
    registry=REGISTRY,
)
PROGRESS_WRITES = Counter(
    "megdet_controller_progress_writes",
    "status.progress writes of the progress endpoint, by result: written, superseded (the run "
    "held that report or a newer one: not written), refused (the API server refused the value "
    "with 400/422: dropped, never retried), error (tried again after an interval), gone (the "
    "run no longer exists).",
    ["result"],
    registry=REGISTRY,
)
HTTP_REFUSED = Counter(
    "megdet_controller_http_refused",
    "Connections to the controller's servers (server: metrics, progress) closed unserved, by "
    "reason: busy (refused: over its source address's cap, or every place answering), "
    "evicted (at the cap, the oldest connection whose request had not arrived, closed for a "
    "newcomer), deadline (the request did not arrive in full within the request timeout).",
    ["server", "reason"],
    registry=REGISTRY,
)

STARTUP = Histogram(
    "megdet_controller_startup_seconds",
    "Time of each part of a MegDetRun attempt's start, as status.startup measures it, observed "
    "once per attempt and part: admission_wait, scheduling, container_start, rendezvous, "
    "data_model, first_iteration, total (created to the first iteration done).",
    ["namespace", "target", "part"],
    # Seconds to tens of minutes: an image pull or a Kueue queue can take that long.
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600),
    registry=REGISTRY,
)

# (namespace, run) -> the label values of its run_info series, so a re-plan or a delete can
# remove the old series instead of leaving a stale one behind.
_run_info_labels: dict[tuple[str, str], tuple[str, ...]] = {}
# Namespaces that ever had a run, so their phase series go to 0 rather than vanish.
_phase_namespaces: set[str] = set()


def record_run_info(
    namespace: str, run: str, target: str, world_size: int, global_batch: int, lr: float
) -> None:
    """Set the run's ``megdet_controller_run_info`` series (replacing an older plan's)."""
    # repr: the shortest text that reads back, 0.02 and not 0.020000000000000004.
    labels = (namespace, run, target, str(world_size), str(global_batch), repr(float(lr)))
    old = _run_info_labels.get((namespace, run))
    if old is not None and old != labels:
        RUN_INFO.remove(*old)
    _run_info_labels[(namespace, run)] = labels
    RUN_INFO.labels(*labels).set(1)


def forget_run(namespace: str, run: str) -> None:
    """Drop a deleted run's ``run_info`` series."""
    old = _run_info_labels.pop((namespace, run), None)
    if old is not None:
        RUN_INFO.remove(*old)


def set_run_phases(phases: Iterable[tuple[str, str]]) -> None:
    """Set ``megdet_controller_runs`` from (namespace, phase) pairs, one per known run.

    Every (namespace, phase) seen before but absent now is set to 0 rather than removed, so a
    dashboard's "runs by phase" drops to zero instead of showing a gap.
    """
    counts = collections.Counter(phases)
    _phase_namespaces.update(ns for ns, _ in counts)
    for namespace in _phase_namespaces:
        for phase in PHASES:
            RUNS.labels(namespace, phase).set(counts[(namespace, phase)])


def sample(name: str, labels: Mapping[str, str] | None = None) -> float:
    """The current value of one series in :data:`REGISTRY` (0.0 when absent); for tests/bench."""
    value = REGISTRY.get_sample_value(name, dict(labels or {}))
    return 0.0 if value is None else value


class MetricsServer:
    """The running /metrics server: its bound port, and :meth:`close` (tests, shutdown)."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        self.port: int = httpd.server_address[1]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)


class _Server(BoundedServerMixin, ThreadingMixIn, WSGIServer):
    """Connections capped, each request within a deadline (http_limits.py)."""

    daemon_threads = True  # a stuck scrape must not keep the process alive
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Plain HTTP to the HTTPS port, a hang-up mid-handshake: a debug line, no traceback.
        _log.debug("metrics: connection from %s failed: %s", client_address, sys.exc_info()[1])


class _QuietHandler(BoundedHandlerMixin, WSGIRequestHandler):
    """The handshake and the request within the deadline, in its own thread (http_limits.py)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _guarded(app: Callable[..., Any], authorizer: Any) -> Callable[..., Any]:
    """``app`` behind ``authorizer`` (a TokenAuthorizer): 401/403/429/500 as plain text."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return iter([b"not found: only /metrics is served\n"])
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return iter([b""])
        verdict = authorizer.check(
            environ.get("HTTP_AUTHORIZATION"), "get", "/metrics", environ.get("REMOTE_ADDR", "")
        )
        if not verdict.allowed:
            headers = [("Content-Type", "text/plain; charset=utf-8")]
            if verdict.status == 401:
                headers.append(("WWW-Authenticate", 'Bearer realm="megdet-controller"'))
            start_response(f"{verdict.status} {HTTPStatus(verdict.status).phrase}", headers)
            return iter([f"{verdict.reason}\n".encode()])
        return app(environ, start_response)

    return guarded


def serve(
    port: int,
    addr: str = "0.0.0.0",  # a pod listens on its own IP
    *,
    authorizer: Any = None,
    ssl_context: ssl.SSLContext | None = None,
    limits: Limits | None = None,
) -> MetricsServer:
    """Serve :data:`REGISTRY` on ``addr:port/metrics`` from a background thread.

    With ``ssl_context`` it speaks HTTPS; with ``authorizer`` (a
    :class:`megdet.controller.tokenauth.TokenAuthorizer`) every request needs a bearer
    token the authorizer accepts. Neither: plain HTTP for anyone who reaches the port.
    ``port`` 0 picks a free port (see :attr:`MetricsServer.port`). ``limits``: the connection
    cap and request deadline (:class:`~megdet.controller.http_limits.Limits`; safe defaults).
    """
    app = make_wsgi_app(REGISTRY)
    if authorizer is not None:
        app = _guarded(app, authorizer)
    server_class = type("_MetricsServer", (_Server,), {})
    if ":" in addr:
        server_class.address_family = socket.AF_INET6
    httpd = make_server(addr, port, app, server_class=server_class, handler_class=_QuietHandler)
    httpd.init_limits(limits, lambda why: HTTP_REFUSED.labels("metrics", why).inc())
    if ssl_context is not None:
        httpd.socket = ssl_context.wrap_socket(
            httpd.socket, server_side=True, do_handshake_on_connect=False
        )
    thread = threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)


def server_ssl_context(cert_dir: str | Path | None = None) -> ssl.SSLContext:
    """A TLS 1.2+ server context: ``cert_dir``'s ``tls.crt``/``tls.key``, or a self-signed pair.

    Raises ValueError naming the missing or unreadable file when ``cert_dir`` is given.
    """
    from megdet.controller.tls import context_from_dir, context_from_pem, self_signed

    if cert_dir is not None:
        return context_from_dir(cert_dir)
    return context_from_pem(*self_signed(socket.gethostname()))
