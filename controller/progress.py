"""Training progress for ``target: pytorchjob``: the controller's status endpoint, started.

The trainer POSTs Kubeflow Trainer's runtime-status protocol (``megdet.progress``: the same
body, env and token scheme as Trainer v2.3.0's status server, ``pkg/statusserver/``) to
``POST /apis/megdet.io/v1alpha1/namespaces/<ns>/megdetruns/<name>/status`` over HTTPS. The
parts, each in its own module:

- :class:`~megdet.controller.tokenauth.RunAuthenticator`: only the run's own pods may report
  (a TokenReview of a token bound to the run's audience, its uid in it, and to a pod of the
  run's job: :mod:`~megdet.controller.progress_binding`), verdicts cached;
- :mod:`~megdet.controller.progress_hub`: reports -> rate-limited ``status.progress`` writes
  and milestone events, never blocking the request;
- :mod:`~megdet.controller.progress_server`: the HTTPS server;
- :mod:`~megdet.controller.progress_ca`: the serving certificate (shared by the replicas
  through a Secret), and its CA published in each run's namespace as ConfigMap
  ``megdet-progress-ca``, which the run chart mounts, and written back when edited;
- :mod:`~megdet.controller.progress_leader`: only the active replica (kopf's peering) serves:
  the other answers 503, writes nothing, and its pod is not in the progress Service.

:func:`start` wires them to the Kubernetes API (``megdet controller --progress-url``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from megdet.controller import metrics
from megdet.controller.http_limits import Limits
from megdet.controller.kubeapi import Cluster
from megdet.controller.progress_binding import PodBinding, RunDirectory, kubernetes_readers
from megdet.controller.progress_ca import (
    CAKeeper,
    ServingCert,
    kubernetes_ca_writer,
    register,
    service_hosts,
)
from megdet.controller.progress_hub import (
    ProgressHub,
    kubernetes_event_poster,
    register_forget,
)
from megdet.controller.progress_leader import ACTIVE_LABEL, Always, PodLabel
from megdet.controller.progress_server import ProgressServer, _status_body
from megdet.controller.tokenauth import RunAuthenticator, token_review

__all__ = ["ActiveOnlyServer", "NotActive", "ProgressService", "start"]

logger = logging.getLogger(__name__)


class NotActive(Exception):
    """A write attempted by a replica that is not the active one (never sent)."""

    status = 503


class ActiveOnlyServer(ProgressServer):
    """The endpoint, answering only while ``active()``: 503 on a standby replica (a report that
    reaches it between a failover and the Service's update is retried by the trainer)."""

    active: Callable[[], bool] = Always().active

    def handle(self, path: str, *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        if not self.active():
            metrics.PROGRESS_REPORTS.labels("busy").inc()
            return 503, _status_body(
                503, "ServiceUnavailable", "this controller replica is on standby"
            )
        return super().handle(path, *args, **kwargs)


@dataclass
class ProgressService:
    """The running endpoint: server thread, flusher thread, leadership thread."""

    server: ProgressServer
    hub: ProgressHub
    cert: ServingCert
    active: Callable[[], bool] = field(default_factory=lambda: Always().active)
    keeper: CAKeeper | None = None
    label: PodLabel | None = None
    #: The served runs, from their watch (what a report is checked against).
    runs: RunDirectory = field(default_factory=RunDirectory)
    stop_event: threading.Event = field(default_factory=threading.Event)
    #: Whether this replica was the active one at the last look of the leadership thread.
    was_active: bool = False

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self, flush_every: float = 1.0, look_every: float = 0.5) -> None:
        threading.Thread(
            target=self.server.serve_forever, name="megdet-progress", daemon=True
        ).start()

        def flusher() -> None:
            while not self.stop_event.wait(flush_every):
                if not self.active():
                    continue  # a standby replica writes nothing
                try:
                    self.hub.flush()
                except Exception:  # never let the writer thread die
                    logger.exception("progress: flush failed")

        def leadership() -> None:
            while True:
                try:
                    self.look()
                except Exception:
                    logger.exception("progress: leadership check failed")
                if self.stop_event.wait(look_every):
                    return

        threading.Thread(target=flusher, name="megdet-progress-flush", daemon=True).start()
        threading.Thread(target=leadership, name="megdet-progress-active", daemon=True).start()

    def look(self) -> None:
        """Twice a second: the active replica makes or restores the CA ConfigMaps that are
        missing or wrong (a standby writes none); one that stopped being active forgets what it
        held (the new active replica reads the written progress); the pod label follows."""
        now = self.active()
        if now and self.keeper is not None:
            self.keeper.resync()  # in memory; a request only for a missing or wrong ConfigMap
        if not now and self.was_active:
            with self.hub.lock:
                held = list(self.hub.runs)
            for namespace, name in held:
                self.hub.forget(namespace, name)
        self.was_active = now
        if self.label is not None:
            self.label.step()

    def stop(self) -> None:
        """Stop serving; a replica that labelled its pod removes the label (best effort: a
        process that dies leaves it to its pod's next process, which removes it at its first
        look, and the pod is not ready meanwhile)."""
        self.stop_event.set()
        if self.keeper is not None:
            self.keeper.stop()
        self.server.shutdown()
        self.server.server_close()
        if self.label is not None and self.label.labelled:
            try:
                self.label.patch_labels({ACTIVE_LABEL: None})
            except Exception as err:
                logger.warning("progress: removing this replica's pod label: %s", err)


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
    ca_secret: str = "",
    active: Callable[[], bool] | None = None,
    namespaces: list[str] | None = None,
    label: PodLabel | None = None,
    limits: Limits | None = None,
) -> ProgressService:
    """Serve the endpoint on ``addr:port`` and register the CA publisher on ``registry``.

    ``active``: whether this replica is kopf's active one (default: always, a single
    replica); ``namespaces``: the served namespaces (default: all), where the CA ConfigMaps
    are watched; ``label``: keeps the active replica's pod label for the progress Service;
    ``limits``: the server's connection cap and request deadline (http_limits.py).
    """
    import kopf

    from megdet.controller.api import GROUP, PLURAL, VERSION

    active = active or Always().active
    cert = _certificate(api_client, timeout, url, cert_dir, ca_secret)
    cluster = Cluster(api_client, timeout=timeout)

    def patch_status(namespace: str, name: str, status: Any) -> Any:
        if not active():  # the flusher checked a moment ago: this closes the gap
            raise NotActive(f"not the active replica: {namespace}/{name} not written")
        return cluster.patch_run_status(namespace, name, status)

    hub = ProgressHub(
        cluster.get_run,
        patch_status,
        kubernetes_event_poster(api_client, timeout, instance),
        interval=interval,
        checkpoint_every=checkpoint_every,
    )
    # The served runs (uid, job) from the runs' watch: a report costs no read of its run.
    runs = RunDirectory()

    async def note_run(event: Any, body: Any, **_: Any) -> None:
        runs.note(body, deleted=event.get("type") == "DELETED")

    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="progress-runs")(note_run)
    register_forget(registry, hub)  # a deleted run's progress state goes with it
    auth = RunAuthenticator(
        token_review(api_client, timeout),
        runs.get,
        PodBinding(*kubernetes_readers(api_client, timeout)),
    )
    server = ActiveOnlyServer((addr, port), hub, auth, cert.context, limits=limits)
    server.active = active
    keeper = CAKeeper(cert.ca_pem, kubernetes_ca_writer(api_client, timeout, cert.ca_pem), active)
    keeper.watch(api_client, timeout, list(namespaces or []))
    service = ProgressService(
        server, hub, cert, active=active, keeper=keeper, label=label, runs=runs
    )
    register(registry, keeper)
    service.start()
    logger.info("progress: serving https://%s:%d (reports every %gs at most)", addr, port, interval)
    return service
