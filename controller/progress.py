"""Training progress for ``target: pytorchjob``: the controller's status endpoint.

The trainer POSTs Kubeflow Trainer's runtime-status protocol (``megdet.progress``: the same
body, env and token scheme as Trainer v2.3.0's status server, ``pkg/statusserver/``) to
``POST /apis/megdet.io/v1alpha1/namespaces/<ns>/megdetruns/<name>/status`` over HTTPS. This
module serves it and turns reports into ``MegDetRun.status.progress``:

- **Auth** (:class:`RunAuthenticator`): the bearer token is a projected ServiceAccount token
  whose audience is the run's (:func:`megdet.progress.run_audience`). A ``TokenReview`` with
  ``spec.audiences=[that audience]`` must say authenticated, list the audience, name a
  ServiceAccount of the run's namespace and carry the pod the token is bound to
  (``authentication.kubernetes.io/pod-name``), named as the training operator names the run's
  pods (``<run>-master-0``, ``<run>-worker-<i>``); optionally (``pod_labels``, off in the
  controller, which reads no pods) that pod must carry the run's label. Anything else is 403
  (401: no
  token at all), logged once per run a minute and counted
  (``megdet_controller_progress_reports_total{result}``). Verdicts are cached per token (its
  SHA-256) for a short time, in a bounded cache.
- **Never blocking** (:class:`ProgressHub`): a report only replaces the run's latest progress
  in memory (the first report of a run after a start also reads the run once, to answer 404
  for an unknown run and to know what was written before). A flusher thread writes
  ``status.progress`` (a merge patch of the status subresource, only that key) at most once
  per run every ``interval`` seconds, and only when it changed: 1,000 reporting runs cost
  1000/interval writes a second (docs/operations.md, "Progress reporting").
- **Events**: a Normal ``Evaluated`` event for each new evaluation (AP, AP50, iteration) and a
  Normal ``Checkpointed`` event every K-th checkpoint, through a per-run token bucket (at most
  :data:`EVENT_BURST` at once, :data:`EVENTS_PER_HOUR` an hour).
- **TLS**: a self-signed CA and serving certificate made at start (or ``--progress-cert-dir``);
  the CA is published in each run's namespace as ConfigMap ``megdet-progress-ca`` (key
  ``ca.crt``), which the run chart mounts next to the token.
"""

from __future__ import annotations

import datetime
import hashlib
import http.server
import ipaddress
import json
import logging
import os
import re
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megdet import progress as protocol
from megdet.controller import metrics
from megdet.controller.metrics_auth import bearer_token

__all__ = [
    "CA_CONFIG_MAP",
    "CA_KEY",
    "EVENTS_PER_HOUR",
    "EVENT_BURST",
    "MAX_BODY",
    "POD_NAME_EXTRA",
    "RESULTS",
    "RUN_LABEL",
    "Milestones",
    "ProgressHub",
    "ProgressServer",
    "RunAuthenticator",
    "ServingCert",
    "TokenBucket",
    "Verdict",
    "ca_config_map",
    "ca_config_map_name",
    "endpoint_url",
]

logger = logging.getLogger(__name__)

#: Largest request body accepted (Trainer's status server: 1 << 16).
MAX_BODY = 64 * 1024
#: TokenReview ``status.user.extra`` key naming the pod a bound token belongs to.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
#: The run chart's label naming a pod's run (its release, which the controller names after the run).
RUN_LABEL = "app.kubernetes.io/instance"
#: Key of the CA in the ConfigMap (Trainer's own ConfigMap uses the same).
CA_KEY = "ca.crt"
#: Values of the ``result`` label of ``megdet_controller_progress_reports_total``.
RESULTS = ("accepted", "unauthenticated", "forbidden", "invalid", "not_found", "error")
#: Per-run event budget: a bucket of EVENT_BURST tokens refilled at EVENTS_PER_HOUR.
EVENT_BURST = 3
EVENTS_PER_HOUR = 6
_PATH = re.compile(
    r"^/apis/megdet\.io/v1alpha1/namespaces/(?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)"
    r"/megdetruns/(?P<name>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)/status$"
)


#: The ConfigMap holding the endpoint's CA, one per namespace with runs, shared by its runs
#: (public data). One fixed name, so the controller's RBAC names it: it may read and update
#: only this ConfigMap of a namespace, not any other (EKS's aws-auth is a ConfigMap).
CA_CONFIG_MAP = "megdet-progress-ca"


def ca_config_map_name(run: str) -> str:
    """The ConfigMap holding the endpoint's CA in a run's namespace (the same for every run)."""
    return CA_CONFIG_MAP


def endpoint_url(base_url: str, namespace: str, name: str) -> str:
    """The URL a run's pods POST to (the run chart builds the same from ``progress.url``)."""
    return base_url.rstrip("/") + protocol.run_status_path(namespace, name)


def ca_config_map(namespace: str, run: str, ca_pem: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ca_config_map_name(run),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "megdet"},
        },
        "data": {CA_KEY: ca_pem},
    }


# ------------------------------------------------------------------------------------------
# Auth.


@dataclass(frozen=True)
class Verdict:
    """200 (the run's own pod), 401 (no token), 403 (any other token), 500 (could not ask)."""

    status: int
    reason: str
    pod: str = ""


#: (token, audiences) -> the TokenReview's ``status`` as a plain dict; raises on API errors.
TokenReviewFn = Callable[[str, list[str]], Mapping[str, Any]]
#: (namespace, pod) -> the pod's labels, or None when there is no such pod.
PodLabelsFn = Callable[[str, str], Mapping[str, str] | None]


@dataclass
class RunAuthenticator:
    """Token -> :class:`Verdict` for one run, with a time- and size-bounded cache."""

    review: TokenReviewFn
    pod_labels: PodLabelsFn | None = None
    allow_ttl: float = 300.0
    deny_ttl: float = 10.0
    max_entries: int = 4096
    clock: Callable[[], float] = time.monotonic
    _cache: OrderedDict[tuple[str, str, str], tuple[float, Verdict]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def check(self, authorization: str | None, namespace: str, name: str) -> Verdict:
        token = bearer_token(authorization)
        if token is None:
            return Verdict(401, "no bearer token")
        key = (hashlib.sha256(token.encode()).hexdigest(), namespace, name)
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                self._cache.move_to_end(key)
                return hit[1]
            self._cache.pop(key, None)
        verdict = self._decide(token, namespace, name)
        if verdict.status in (200, 403):
            ttl = self.allow_ttl if verdict.status == 200 else self.deny_ttl
            with self._lock:
                self._cache[key] = (now + ttl, verdict)
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
        return verdict

    def cached(self) -> int:
        with self._lock:
            return len(self._cache)

    def _decide(self, token: str, namespace: str, name: str) -> Verdict:
        audience = protocol.run_audience(namespace, name)
        try:
            status = self.review(token, [audience]) or {}
        except Exception as err:
            logger.error("progress: TokenReview failed: %s: %s", type(err).__name__, err)
            return Verdict(500, "the token could not be reviewed")
        if not status.get("authenticated"):
            return Verdict(403, f"token not valid for audience {audience}")
        if audience not in (status.get("audiences") or []):
            return Verdict(403, f"token audiences do not include {audience}")
        user = status.get("user") or {}
        username = str(user.get("username") or "")
        if not username.startswith(f"system:serviceaccount:{namespace}:"):
            return Verdict(403, f"{username or 'the user'} is not a ServiceAccount of {namespace}")
        pods = (user.get("extra") or {}).get(POD_NAME_EXTRA) or []
        if not pods:
            return Verdict(403, "the token is not bound to a pod")
        pod = str(pods[0])
        # The training operator names a PyTorchJob's pods <job>-master-0 and <job>-worker-<i>,
        # and the job is named after the run: another pod's token is refused without reading
        # any pod (the controller holds no `get pods`).
        if not re.fullmatch(rf"{re.escape(name)}-(master|worker)-\d+", pod):
            return Verdict(403, f"pod {namespace}/{pod} is not a pod of MegDetRun {name}")
        if self.pod_labels is not None:
            try:
                labels = self.pod_labels(namespace, pod)
            except Exception as err:
                logger.error("progress: get pod %s/%s failed: %s", namespace, pod, err)
                return Verdict(500, "the token's pod could not be read")
            if labels is None:
                return Verdict(403, f"pod {namespace}/{pod} does not exist")
            if labels.get(RUN_LABEL) != name:
                return Verdict(403, f"pod {namespace}/{pod} is not a pod of MegDetRun {name}")
        return Verdict(200, "the run's pod", pod)


# ------------------------------------------------------------------------------------------
# Reports -> status writes and events.


@dataclass
class TokenBucket:
    """``capacity`` tokens, refilled at ``per_hour`` an hour; :meth:`take` spends one."""

    capacity: float = EVENT_BURST
    per_hour: float = EVENTS_PER_HOUR
    tokens: float = EVENT_BURST
    at: float | None = None

    def take(self, now: float) -> bool:
        if self.at is not None:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.per_hour / 3600)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@dataclass
class Milestones:
    """Which reports deserve an event: each new evaluation (``Evaluated``, with AP and AP50)
    and every ``checkpoint_every``-th new checkpoint (``Checkpointed``), through a per-run
    :class:`TokenBucket`. One per run, for both targets (the TrainJob mirror uses it too)."""

    checkpoint_every: int = 5
    eval_iteration: int | None = None
    checkpoint_iteration: int | None = None
    checkpoints: int = 0
    bucket: TokenBucket = field(default_factory=TokenBucket)

    @classmethod
    def from_written(cls, written: Mapping[str, Any], checkpoint_every: int) -> Milestones:
        """Continue from a written ``status.progress`` (a restarted controller repeats none)."""
        return cls(
            checkpoint_every=checkpoint_every,
            eval_iteration=written.get("evalIteration"),
            checkpoint_iteration=written.get("checkpointIteration"),
        )

    def note(self, p: Mapping[str, Any], now: float) -> list[tuple[str, str]]:
        events = []
        ev = p.get("evalIteration")
        if isinstance(ev, int) and (self.eval_iteration is None or ev > self.eval_iteration):
            self.eval_iteration = ev
            if p.get("ap") is not None and self.bucket.take(now):
                events.append(
                    (
                        "Evaluated",
                        f"evaluated at iteration {ev}: AP {_num(p.get('ap'))}, "
                        f"AP50 {_num(p.get('ap50'))}",
                    )
                )
        ck = p.get("checkpointIteration")
        if isinstance(ck, int) and (
            self.checkpoint_iteration is None or ck > self.checkpoint_iteration
        ):
            self.checkpoint_iteration = ck
            self.checkpoints += 1
            if self.checkpoints % self.checkpoint_every == 0 and self.bucket.take(now):
                when = p.get("checkpointTime")
                events.append(
                    (
                        "Checkpointed",
                        f"checkpoint at iteration {ck}" + (f" ({when})" if when else ""),
                    )
                )
        return events


@dataclass
class _Run:
    uid: str
    milestones: Milestones
    latest: dict[str, Any] | None = None
    written: dict[str, Any] = field(default_factory=dict)
    last_write: float | None = None
    events: list[tuple[str, str]] = field(default_factory=list)


class UnknownRun(Exception):
    """The run does not exist (404), or is not served here (target trainjob)."""


#: (namespace, name) -> the run object, or None.
GetRunFn = Callable[[str, str], Mapping[str, Any] | None]
#: (namespace, name, status patch) -> None; raises ApiException-like (``.status``) errors.
PatchStatusFn = Callable[[str, str, Mapping[str, Any]], Any]
#: (namespace, name, uid, reason, message) -> None.
PostEventFn = Callable[[str, str, str, str, str], Any]


class ProgressHub:
    """The latest progress per run, and the rate-limited writer of ``status.progress``."""

    def __init__(
        self,
        get_run: GetRunFn,
        patch_status: PatchStatusFn,
        post_event: PostEventFn,
        *,
        interval: float = 30.0,
        checkpoint_every: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        self.get_run = get_run
        self.patch_status = patch_status
        self.post_event = post_event
        self.interval = interval
        self.checkpoint_every = checkpoint_every
        self.clock = clock
        self.runs: dict[tuple[str, str], _Run] = {}
        self.lock = threading.Lock()
        self.writes = 0

    def report(self, namespace: str, name: str, progress: Mapping[str, Any]) -> None:
        """Remember ``progress`` (a ``status.progress`` dict) as the run's latest. Raises
        :class:`UnknownRun` for a run that does not exist or is not ``target: pytorchjob``."""
        key = (namespace, name)
        with self.lock:
            run = self.runs.get(key)
        if run is None:
            run = self._load(namespace, name)
        with self.lock:
            run = self.runs.setdefault(key, run)
            merged = {**(run.latest or run.written), **progress}
            run.latest = merged
            self._note_events(run, merged)

    def _load(self, namespace: str, name: str) -> _Run:
        body = self.get_run(namespace, name)
        if body is None:
            raise UnknownRun(f"MegDetRun {namespace}/{name} not found")
        spec = body.get("spec") or {}
        if spec.get("target") == "trainjob":
            raise UnknownRun(
                f"MegDetRun {namespace}/{name} has target trainjob: its pods report to "
                "Kubeflow Trainer's status server"
            )
        status = body.get("status") or {}
        written = status.get("progress") if isinstance(status.get("progress"), Mapping) else {}
        return _Run(
            uid=str((body.get("metadata") or {}).get("uid") or ""),
            milestones=Milestones.from_written(written, self.checkpoint_every),
            written=dict(written),
        )

    def _note_events(self, run: _Run, p: Mapping[str, Any]) -> None:
        run.events.extend(run.milestones.note(p, self.clock()))

    def due(self) -> list[tuple[str, str, dict[str, Any]]]:
        """The (namespace, name, merge patch of status.progress) that may be written now."""
        now = self.clock()
        out = []
        with self.lock:
            for (namespace, name), run in self.runs.items():
                if run.latest is None or run.latest == run.written:
                    continue
                if run.last_write is not None and now - run.last_write < self.interval:
                    continue
                patch: dict[str, Any] = dict(run.latest)
                for gone in set(run.written) - set(run.latest):
                    patch[gone] = None  # a merge patch deletes a key with null
                out.append((namespace, name, patch))
        return out

    def flush(self) -> int:
        """Write every due run's progress and post queued events; returns the writes made."""
        done = 0
        for namespace, name, patch in self.due():
            try:
                self.patch_status(namespace, name, {"progress": patch})
            except Exception as err:
                if getattr(err, "status", None) == 404:
                    with self.lock:
                        self.runs.pop((namespace, name), None)
                    continue
                logger.warning("progress: status write of %s/%s failed: %s", namespace, name, err)
                with self.lock:  # try again after a full interval, not in a tight loop
                    run = self.runs.get((namespace, name))
                    if run is not None:
                        run.last_write = self.clock()
                continue
            done += 1
            with self.lock:
                self.writes += 1
                run = self.runs.get((namespace, name))
                if run is not None:
                    run.written = {k: v for k, v in patch.items() if v is not None}
                    run.last_write = self.clock()
        with self.lock:
            pending = [
                (ns, name, run.uid, events)
                for (ns, name), run in self.runs.items()
                for events in [run.events]
                if events
            ]
            for run in self.runs.values():
                run.events = []
        for namespace, name, uid, events in pending:
            for reason, message in events:
                try:
                    self.post_event(namespace, name, uid, reason, message)
                except Exception as err:
                    logger.warning("progress: event %s for %s/%s: %s", reason, namespace, name, err)
        return done

    def forget(self, namespace: str, name: str) -> None:
        with self.lock:
            self.runs.pop((namespace, name), None)


def _num(value: Any) -> str:
    return "?" if value is None else f"{float(value):.2f}"


# ------------------------------------------------------------------------------------------
# The HTTPS server.


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


# ------------------------------------------------------------------------------------------
# TLS.


@dataclass(frozen=True)
class ServingCert:
    """The endpoint's TLS context and the CA (PEM) that clients verify it with."""

    context: ssl.SSLContext
    ca_pem: str

    @classmethod
    def generate(cls, hosts: list[str]) -> ServingCert:
        """A fresh CA and a serving certificate for ``hosts`` (and localhost, 127.0.0.1)."""
        ca_pem, cert_pem, key_pem = _make_certs(hosts)
        return cls(_context(cert_pem + ca_pem, key_pem), ca_pem.decode())

    @classmethod
    def from_dir(cls, cert_dir: str | Path) -> ServingCert:
        """``tls.crt``, ``tls.key`` and ``ca.crt`` (a cert-manager Secret's keys; without
        ``ca.crt`` the certificate itself is the CA)."""
        folder = Path(cert_dir)
        cert, key, ca = folder / "tls.crt", folder / "tls.key", folder / CA_KEY
        for path in (cert, key):
            if not path.is_file():
                raise ValueError(f"--progress-cert-dir: {path} does not exist")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as err:
            raise ValueError(f"--progress-cert-dir: cannot load {cert} / {key}: {err}") from None
        return cls(context, (ca if ca.is_file() else cert).read_text())


def _context(chain_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="megdet-progress-") as tmp:
        cert_file, key_file = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(key_pem)
        Path(cert_file).write_bytes(chain_pem)
        context.load_cert_chain(cert_file, key_file)
    return context


def _make_certs(hosts: list[str]) -> tuple[bytes, bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"megdet-progress-ca@{int(time.time())}")]
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in [*hosts, "localhost", "127.0.0.1"]:
        if not host:
            continue
        try:
            entry: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            entry = x509.DNSName(host)
        if entry not in names:
            names.append(entry)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "megdet-progress")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ca.public_bytes(pem), leaf.public_bytes(pem), key_pem


def service_hosts(url: str) -> list[str]:
    """The names a Service URL's host is reached by: ``svc.ns.svc`` -> also ``svc``, ``svc.ns``,
    ``svc.ns.svc.cluster.local``."""
    host = urllib.parse.urlsplit(url).hostname or ""
    hosts = [host]
    parts = host.split(".")
    if len(parts) >= 3 and parts[2] == "svc":
        hosts += [
            parts[0],
            ".".join(parts[:2]),
            ".".join(parts[:3]),
            ".".join(parts[:3]) + ".cluster.local",
        ]
    return list(dict.fromkeys(h for h in hosts if h))


# ------------------------------------------------------------------------------------------
# Wiring to the Kubernetes API (main.py).


def kubernetes_review(api_client: Any, timeout: float) -> TokenReviewFn:
    from kubernetes import client as k8s

    authn = k8s.AuthenticationV1Api(api_client)

    def review(token: str, audiences: list[str]) -> Mapping[str, Any]:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences},
        }
        result = authn.create_token_review(body=body, _request_timeout=timeout)
        return api_client.sanitize_for_serialization(result.status) or {}

    return review


def kubernetes_pod_labels(api_client: Any, timeout: float) -> PodLabelsFn:
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api_client)

    def labels(namespace: str, pod: str) -> Mapping[str, str] | None:
        try:
            found = core.read_namespaced_pod(pod, namespace, _request_timeout=timeout)
        except k8s.ApiException as err:
            if err.status == 404:
                return None
            raise
        return dict(found.metadata.labels or {})

    return labels


def kubernetes_event_poster(api_client: Any, timeout: float, instance: str) -> PostEventFn:
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api_client)

    def post(namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "megdet.io/v1alpha1",
                "kind": "MegDetRun",
                "name": name,
                "namespace": namespace,
                "uid": uid,
            },
            "reason": reason,
            "message": message[:1000],
            "type": "Normal",
            "source": {"component": "megdet-controller"},
            "reportingComponent": "megdet-controller",
            "reportingInstance": instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        core.create_namespaced_event(namespace, body, _request_timeout=timeout)

    return post


def publish_ca(api_client: Any, timeout: float, run: Mapping[str, Any], ca_pem: str) -> None:
    """Create or update the ``megdet-progress-ca`` ConfigMap in the run's namespace. It is
    shared by the namespace's runs and owned by none: deleting a run leaves it for the others."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api_client)
    meta = run.get("metadata") or {}
    namespace, name = meta["namespace"], meta["name"]
    wanted = ca_config_map(namespace, name, ca_pem)
    try:
        core.create_namespaced_config_map(namespace, wanted, _request_timeout=timeout)
        return
    except k8s.ApiException as err:
        if err.status != 409:
            raise
    found = core.read_namespaced_config_map(CA_CONFIG_MAP, namespace, _request_timeout=timeout)
    if (found.data or {}).get(CA_KEY) != ca_pem:
        core.patch_namespaced_config_map(
            CA_CONFIG_MAP, namespace, {"data": {CA_KEY: ca_pem}}, _request_timeout=timeout
        )


@dataclass
class ProgressService:
    """The running endpoint: server thread, flusher thread."""

    server: ProgressServer
    hub: ProgressHub
    cert: ServingCert
    stop_event: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self, flush_every: float = 1.0) -> None:
        threading.Thread(
            target=self.server.serve_forever, name="megdet-progress", daemon=True
        ).start()

        def flusher() -> None:
            while not self.stop_event.wait(flush_every):
                try:
                    self.hub.flush()
                except Exception:  # never let the writer thread die
                    logger.exception("progress: flush failed")

        threading.Thread(target=flusher, name="megdet-progress-flush", daemon=True).start()

    def stop(self) -> None:
        self.stop_event.set()
        self.server.shutdown()
        self.server.server_close()


def register(registry: Any, api_client: Any, timeout: float, ca_pem: str) -> None:
    """kopf handlers that publish the CA into each ``target: pytorchjob`` run's namespace (on
    create, and on resume: a restarted controller has a new self-signed CA)."""
    import kopf

    def publish(body: Any, **_: Any) -> None:
        run = dict(body)
        if (run.get("spec") or {}).get("target") == "trainjob":
            return
        publish_ca(api_client, timeout, run, ca_pem)

    for on in (kopf.on.create, kopf.on.resume):
        on("megdet.io", "v1alpha1", "megdetruns", registry=registry, id="progress-ca")(publish)


def start(
    api_client: Any,
    registry: Any,
    *,
    url: str,
    port: int,
    cert_dir: str | None,
    interval: float,
    checkpoint_every: int,
    timeout: float,
    instance: str,
    addr: str = "0.0.0.0",
) -> ProgressService:
    """Serve the endpoint on ``addr:port`` and register the CA publisher on ``registry``."""
    from megdet.controller.operator import Cluster

    cert = ServingCert.from_dir(cert_dir) if cert_dir else ServingCert.generate(service_hosts(url))
    cluster = Cluster(api_client, timeout=timeout)
    hub = ProgressHub(
        cluster.get_run,
        lambda ns, name, status: cluster.patch_run_status(ns, name, status),
        kubernetes_event_poster(api_client, timeout, instance),
        interval=interval,
        checkpoint_every=checkpoint_every,
    )
    # The audience is the run's own, so only pods whose spec asks for it hold such a token;
    # like Trainer's status server, no pod is read (the controller needs no `get pods`).
    auth = RunAuthenticator(kubernetes_review(api_client, timeout))
    server = ProgressServer((addr, port), hub, auth, cert.context)
    service = ProgressService(server, hub, cert)
    register(registry, api_client, timeout, cert.ca_pem)
    service.start()
    logger.info("progress: serving https://%s:%d (reports every %gs at most)", addr, port, interval)
    return service
