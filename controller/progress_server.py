"""The progress endpoint's HTTPS server: authenticate, hand the report to the hub, answer.

``POST /apis/megdet.io/v1alpha1/namespaces/<ns>/megdetruns/<name>/status`` with Kubeflow
Trainer's runtime-status body (``{"trainerStatus": {...}}``), answered as Trainer v2.3.0's
status server answers (``pkg/statusserver/``): the body back on 200, a ``metav1.Status`` on a
failure. Refusals are logged once per run a minute and every report is counted
(``megdet_controller_progress_reports_total{result}``, :data:`RESULTS`).
"""

from __future__ import annotations

import http.server
import json
import logging
import re
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from megdet import progress as protocol
from megdet.controller import metrics
from megdet.controller.api import GROUP, PLURAL, VERSION
from megdet.controller.progress_auth import RunAuthenticator, Verdict
from megdet.controller.progress_hub import ProgressHub, UnknownRun

__all__ = ["MAX_BODY", "RESULTS", "ProgressServer"]

logger = logging.getLogger(__name__)

#: Largest request body accepted (Trainer's status server: 1 << 16).
MAX_BODY = 64 * 1024
#: Values of the ``result`` label of ``megdet_controller_progress_reports_total``.
RESULTS = ("accepted", "unauthenticated", "forbidden", "invalid", "not_found", "error")
_PATH = re.compile(
    rf"^/apis/{re.escape(GROUP)}/{re.escape(VERSION)}"
    r"/namespaces/(?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)"
    rf"/{re.escape(PLURAL)}/(?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)/status$"
)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ProgressServer
    protocol_version = "HTTP/1.1"
    timeout = 30

    def setup(self) -> None:
        super().setup()
        try:
            self.connection.do_handshake()  # in this thread, so a slow client blocks no other
        except (OSError, ssl.SSLError):
            self.close_connection = True
            raise

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("progress: %s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._send(405, _status_body(405, "MethodNotAllowed", "POST only"))

    do_PUT = do_PATCH = do_DELETE = do_GET

    def do_POST(self) -> None:
        code, body = self.server.handle(
            urllib.parse.urlsplit(self.path).path,
            self.headers.get("Authorization"),
            self.headers.get("Content-Length"),
            self.rfile,
        )
        self._send(code, body)

    def _send(self, code: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if code >= 400:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)


def _status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    """A ``metav1.Status`` failure body, as Trainer's status server answers."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class ProgressServer(http.server.ThreadingHTTPServer):
    """The endpoint: authenticates, hands the progress to the hub, answers."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        hub: ProgressHub,
        auth: RunAuthenticator,
        context: ssl.SSLContext | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(address, _Handler)
        if context is not None:
            self.socket = context.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )
        self.hub = hub
        self.auth = auth
        self.clock = clock
        self._logged: dict[tuple[str, str], float] = {}

    def handle(
        self, path: str, authorization: str | None, length: str | None, rfile: Any
    ) -> tuple[int, dict[str, Any]]:
        found = _PATH.match(path)
        if found is None:
            return 404, _status_body(404, "NotFound", f"no endpoint {path[:200]}")
        namespace, name = found["ns"], found["name"]
        verdict = self.auth.check(authorization, namespace, name)
        if verdict.status != 200:
            if verdict.status == 500:
                metrics.PROGRESS_REPORTS.labels("error").inc()
                return 500, _status_body(500, "InternalError", verdict.reason)
            result = "unauthenticated" if verdict.status == 401 else "forbidden"
            metrics.PROGRESS_REPORTS.labels(result).inc()
            self._log_refusal(namespace, name, verdict)
            reason = "Unauthorized" if verdict.status == 401 else "Forbidden"
            return verdict.status, _status_body(verdict.status, reason, reason)
        try:
            size = int(length or "")
        except ValueError:
            metrics.PROGRESS_REPORTS.labels("invalid").inc()
            return 411, _status_body(411, "LengthRequired", "Content-Length required")
        if size < 0 or size > MAX_BODY:
            metrics.PROGRESS_REPORTS.labels("invalid").inc()
            if 0 < size <= 16 * MAX_BODY:
                rfile.read(size)  # drained, so that the client reads the answer, not a reset
            return 413, _status_body(413, "RequestEntityTooLarge", f"body over {MAX_BODY} bytes")
        raw = rfile.read(size)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("trainerStatus"), Mapping):
            metrics.PROGRESS_REPORTS.labels("invalid").inc()
            return 422, _status_body(
                422, "Invalid", 'Invalid payload: expected {"trainerStatus": {...}}'
            )
        progress, problems = protocol.to_status(body["trainerStatus"])
        if not progress:
            metrics.PROGRESS_REPORTS.labels("invalid").inc()
            return 422, _status_body(422, "Invalid", "Invalid payload: " + "; ".join(problems))
        if problems:
            logger.info("progress: %s/%s: parts left out: %s", namespace, name, problems[:5])
        try:
            self.hub.report(namespace, name, progress)
        except UnknownRun as err:
            metrics.PROGRESS_REPORTS.labels("not_found").inc()
            return 404, _status_body(404, "NotFound", str(err))
        except Exception as err:
            metrics.PROGRESS_REPORTS.labels("error").inc()
            logger.error("progress: %s/%s: %s: %s", namespace, name, type(err).__name__, err)
            return 500, _status_body(500, "InternalError", "the run could not be read")
        metrics.PROGRESS_REPORTS.labels("accepted").inc()
        return 200, body

    def _log_refusal(self, namespace: str, name: str, verdict: Verdict) -> None:
        now = self.clock()
        key = (namespace, name)
        if now - self._logged.get(key, -1e18) >= 60:
            self._logged[key] = now
            if len(self._logged) > 10000:
                self._logged.clear()
            logger.warning(
                "progress: report for MegDetRun %s/%s refused (%d): %s",
                namespace,
                name,
                verdict.status,
                verdict.reason,
            )
