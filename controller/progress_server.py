"""The progress endpoint's HTTPS server and its start: authenticate, hand the report to the hub,
answer as Kubeflow Trainer's status server does. docs/architecture.md, "Progress reporting".
"""

from __future__ import annotations

import http.server
import json
import logging
import re
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from megdet import progress as protocol
from megdet.controller import metrics
from megdet.controller.api import GROUP, PLURAL, VERSION
from megdet.controller.fabric_condition import condition_writer
from megdet.controller.http_limits import BoundedHandlerMixin, BoundedServerMixin, Limits
from megdet.controller.kubeapi import Cluster
from megdet.controller.progress_auth import IssuerKeys, RunAuthenticator, kubernetes_fetch
from megdet.controller.progress_binding import (
    JOB_API_VERSION,
    JOB_KIND,
    Directory,
    PodBinding,
    pod_ref,
    run_ref,
)
from megdet.controller.progress_ca import (
    CAKeeper,
    ServingCert,
    kubernetes_ca_writer,
    service_hosts,
)
from megdet.controller.progress_hub import HubFull, InvalidProgress, ProgressHub, UnknownRun
from megdet.controller.progress_watch import ListWatch, labelled, watch_each
from megdet.controller.tokenauth import BoundedLRU, TokenBucket, Verdict
from megdet.fabric_report import from_metrics

__all__ = [
    "MAX_BODY",
    "MAX_LOGGED",
    "RESULTS",
    "ProgressServer",
    "ProgressService",
    "run_of_path",
    "start",
]

logger = logging.getLogger(__name__)

#: Largest request body accepted (Trainer's status server: 1 << 16).
MAX_BODY = 64 * 1024
#: Runs whose refusals are remembered (to log each once a minute); the oldest goes first.
MAX_LOGGED = 1024
#: Refusal log lines in all: at most LOG_BURST at once, LOGS_PER_MINUTE a minute.
LOG_BURST = 20
LOGS_PER_MINUTE = 10
#: Values of the ``result`` label of ``megdet_controller_progress_reports_total``.
RESULTS = (
    "accepted",
    "unauthenticated",
    "forbidden",
    "invalid",
    "not_found",
    "busy",
    "error",
)
_PREFIX = f"/apis/{GROUP}/{VERSION}/namespaces/"
_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_PATH = re.compile(
    rf"^{re.escape(_PREFIX)}(?P<ns>{_LABEL})/{re.escape(PLURAL)}"
    rf"/(?P<name>{_LABEL}(?:\.{_LABEL})*)/status$"
)
#: The longest path that can name a run: a 63-character namespace, a 253-character name.
MAX_PATH = len(_PREFIX) + 63 + len(f"/{PLURAL}/") + 253 + len("/status")


def run_of_path(path: str) -> tuple[str, str] | None:
    """(namespace, name) of a run's status path, or None when it cannot name a run."""
    if len(path) > MAX_PATH:
        return None
    found = _PATH.match(path)
    if found is None or len(found["name"]) > 253:
        return None
    return found["ns"], found["name"]


class _Handler(BoundedHandlerMixin, http.server.BaseHTTPRequestHandler):
    server: ProgressServer
    protocol_version = "HTTP/1.1"

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection:
            self.next_request()  # a kept-alive connection: a new deadline for the next one
            self.handle_one_request()

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
            self.client_address[0] if self.client_address else "",
        )
        self._send(code, body)

    def _send(self, code: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if code == 503:
            self.send_header("Retry-After", "1")
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


def _failed(result: str, code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    """A failure answer, counted as ``result`` (:data:`RESULTS`)."""
    metrics.PROGRESS_REPORTS.labels(result).inc()
    return code, _status_body(code, reason, message)


class ProgressServer(BoundedServerMixin, http.server.ThreadingHTTPServer):
    """The endpoint; ``limits``: its bounds (:class:`~megdet.controller.http_limits.Limits`)."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        hub: ProgressHub,
        auth: RunAuthenticator,
        context: ssl.SSLContext | None,
        clock: Callable[[], float] = time.monotonic,
        limits: Limits | None = None,
    ) -> None:
        self.init_limits(limits, lambda why: metrics.HTTP_REFUSED.labels("progress", why).inc())
        super().__init__(address, _Handler)
        if context is not None:
            self.socket = context.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )
        self.hub = hub
        self.auth = auth
        self.clock = clock
        #: (namespace, run) -> when its last refusal was logged.
        self.logged = BoundedLRU(MAX_LOGGED)
        self._log_lock = threading.Lock()
        self._log_budget = TokenBucket(LOG_BURST, LOGS_PER_MINUTE * 60, LOG_BURST)
        self._unlogged = 0

    def handle(
        self,
        path: str,
        authorization: str | None,
        length: str | None,
        rfile: Any,
        source: str = "",
    ) -> tuple[int, dict[str, Any]]:
        run = run_of_path(path)
        if run is None:
            return _failed("not_found", 404, "NotFound", f"no endpoint {path[:200]}")
        namespace, name = run
        verdict = self.auth.check(authorization, namespace, name, source)
        if verdict.status == 500:
            return _failed("error", 500, "InternalError", verdict.reason)
        if verdict.status == 401:  # no well-formed token: nothing is remembered of it
            return _failed("unauthenticated", 401, "Unauthorized", "Unauthorized")
        if verdict.status != 200:
            self._log_refusal(namespace, name, verdict)
            return _failed("forbidden", 403, "Forbidden", "Forbidden")
        try:
            size = int(length or "")
        except ValueError:
            return _failed("invalid", 411, "LengthRequired", "Content-Length required")
        if size < 0 or size > MAX_BODY:
            if 0 < size <= 2 * MAX_BODY:
                rfile.read(size)  # drained, so that the client reads the answer, not a reset
            return _failed("invalid", 413, "RequestEntityTooLarge", f"body over {MAX_BODY} bytes")
        try:
            body = json.loads(rfile.read(size))
        except (ValueError, UnicodeDecodeError, RecursionError):
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("trainerStatus"), Mapping):
            message = 'Invalid payload: expected {"trainerStatus": {...}}'
            return _failed("invalid", 422, "Invalid", message)
        progress, problems = protocol.to_status(body["trainerStatus"])
        if not progress:
            return _failed("invalid", 422, "Invalid", "Invalid payload: " + "; ".join(problems))
        fabric = from_metrics(body["trainerStatus"].get("metrics"))
        try:
            self.hub.report(namespace, name, progress, fabric)
        except InvalidProgress as err:
            return _failed("invalid", 422, "Invalid", f"Invalid payload: {err}")
        except UnknownRun as err:
            return _failed("not_found", 404, "NotFound", str(err))
        except HubFull as err:
            return _failed("busy", 503, "ServiceUnavailable", str(err))
        except Exception as err:
            logger.error("progress: %s/%s: %s: %s", namespace, name, type(err).__name__, err)
            return _failed("error", 500, "InternalError", "the report could not be kept")
        if problems:
            logger.info("progress: %s/%s: parts left out: %s", namespace, name, problems[:5])
        metrics.PROGRESS_REPORTS.labels("accepted").inc()
        return 200, body

    def _log_refusal(self, namespace: str, name: str, verdict: Verdict) -> None:
        """Log a refusal once per run a minute, within :data:`LOGS_PER_MINUTE` in all."""
        now = self.clock()
        key = (namespace, name)
        with self._log_lock:
            if now - self.logged.get(key, -1e18) < 60:
                return
            self.logged.put(key, now)
            if not self._log_budget.take(now):
                self._unlogged += 1
                return
            unlogged, self._unlogged = self._unlogged, 0
        logger.warning(
            "progress: report for MegDetRun %s/%s refused (%d): %s%s",
            namespace,
            name,
            verdict.status,
            verdict.reason,
            f" ({unlogged} more refusals not logged)" if unlogged else "",
        )


@dataclass
class ProgressService:
    """The running endpoint: its server, flusher and CA threads, and its watches."""

    server: ProgressServer
    hub: ProgressHub
    cert: ServingCert
    keeper: CAKeeper
    runs: Directory
    pods: Directory
    stop_event: threading.Event = field(default_factory=threading.Event)
    watches: list[ListWatch] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self, flush_every: float = 1.0, look_every: float = 0.5) -> None:
        def every(seconds: float, step: Callable[[], Any], what: str) -> None:
            while not self.stop_event.wait(seconds):
                try:
                    step()
                except Exception:  # never let the thread die
                    logger.exception("progress: %s failed", what)

        threading.Thread(
            target=self.server.serve_forever, name="megdet-progress", daemon=True
        ).start()
        threading.Thread(target=every, args=(flush_every, self.hub.flush, "flush"),
                         name="megdet-progress-flush", daemon=True).start()  # fmt: skip
        # In memory: a request only for a missing or wrong ConfigMap.
        threading.Thread(target=every, args=(look_every, self.keeper.resync, "CA resync"),
                         name="megdet-progress-ca", daemon=True).start()  # fmt: skip

    def note_run(self, kind: str, body: dict[str, Any]) -> None:
        """A run's watch event: to the directory, the hub (deleted) and the CA keeper."""
        deleted = kind == "DELETED"
        self.runs.note(body, deleted=deleted)
        meta = body.get("metadata") or {}
        if deleted:
            self.hub.forget(meta.get("namespace"), meta.get("name"))
        elif run_ref(body) is not None:
            self.keeper.publish(meta["namespace"])

    def note_runs(self, items: list[dict[str, Any]], namespace: str | None) -> None:
        self.runs.relist(items, namespace)
        for body in items:
            self.note_run("ADDED", body)

    def watch(self, api_client: Any, timeout: float, namespaces: list[str]) -> None:
        """Start the watches of the runs, their pods and the CA ConfigMaps in ``namespaces``."""
        from kubernetes import client as k8s

        from megdet.controller.pod_problems import PART_OF

        custom, core = k8s.CustomObjectsApi(api_client), k8s.CoreV1Api(api_client)
        self.watches += watch_each(
            namespaces,
            lambda **kw: custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kw),
            lambda ns, **kw: custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, **kw),
            self.note_runs, self.note_run, timeout=timeout, what="MegDetRuns",
        )  # fmt: skip
        self.watches += watch_each(
            namespaces, core.list_pod_for_all_namespaces, core.list_namespaced_pod,
            self.pods.relist, lambda kind, body: self.pods.note(body, deleted=kind == "DELETED"),
            keep=labelled(*PART_OF), selectors={"label_selector": "=".join(PART_OF)},
            timeout=timeout, what="pods",
        )  # fmt: skip
        self.watches += self.keeper.watch(api_client, timeout, namespaces)

    def stop(self) -> None:
        self.stop_event.set()
        for w in self.watches:
            w.stop()
        self.server.shutdown()
        self.server.server_close()


def _certificate(
    api_client: Any, timeout: float, url: str, cert_dir: str | None, ca_secret: str
) -> ServingCert:
    if cert_dir:
        return ServingCert.from_dir(cert_dir)
    hosts = service_hosts(url)
    if ca_secret:
        namespace, _, name = ca_secret.partition("/")
        return ServingCert.shared(api_client, timeout, namespace, name, hosts)
    return ServingCert.generate(hosts)


def start(
    api_client: Any,
    *,
    url: str,
    port: int,
    cert_dir: str | None,
    interval: float,
    timeout: float,
    addr: str = "0.0.0.0",
    ca_secret: str = "",
    namespaces: list[str] | None = None,
    limits: Limits | None = None,
) -> ProgressService:
    """Serve the endpoint on ``addr:port``, watching ``namespaces`` (default: all)."""
    cert = _certificate(api_client, timeout, url, cert_dir, ca_secret)
    cluster = Cluster(api_client, timeout=timeout)
    from megdet.controller.status_writer import now_text

    runs, pods = Directory(run_ref), Directory(pod_ref)
    hub = ProgressHub(
        runs.get,
        lambda ns, name: run_ref(cluster.get_run(ns, name)),
        cluster.patch_run_status,
        interval=interval,
        write_fabric=condition_writer(cluster.get_run, cluster.patch_run_status, now_text),
    )
    auth = RunAuthenticator(
        IssuerKeys(kubernetes_fetch(api_client, timeout)),
        runs.get,
        PodBinding(lambda ns, name: cluster.get(JOB_API_VERSION, JOB_KIND, ns, name), pods),
    )
    server = ProgressServer((addr, port), hub, auth, cert.context, limits=limits)
    keeper = CAKeeper(cert.ca_pem, kubernetes_ca_writer(api_client, timeout, cert.ca_pem))
    service = ProgressService(server, hub, cert, keeper, runs, pods)
    service.watch(api_client, timeout, list(namespaces or []))
    service.start()
    logger.info("progress: serving https://%s:%d (reports every %gs at most)", addr, port, interval)
    return service
