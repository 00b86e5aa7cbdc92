"""Training progress for ``target: pytorchjob``: the controller's status endpoint, started.

The trainer POSTs Kubeflow Trainer's runtime-status protocol (``megdet.progress``: the same
body, env and token scheme as Trainer v2.3.0's status server, ``pkg/statusserver/``) to
``POST /apis/megdet.io/v1alpha1/namespaces/<ns>/megdetruns/<name>/status`` over HTTPS. The
parts, each in its own module:

- :mod:`~megdet.controller.progress_auth`: only the run's own pods may report (a TokenReview
  of a token bound to the run's audience and pod), verdicts cached;
- :mod:`~megdet.controller.progress_hub`: reports -> rate-limited ``status.progress`` writes
  and milestone events, never blocking the request;
- :mod:`~megdet.controller.progress_server`: the HTTPS server;
- :mod:`~megdet.controller.progress_ca`: the serving certificate, and its CA published in
  each run's namespace as ConfigMap ``megdet-progress-ca``, which the run chart mounts.

:func:`start` wires them to the Kubernetes API (``megdet controller --progress-url``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from megdet.controller.kubeapi import Cluster
from megdet.controller.progress_auth import RunAuthenticator, kubernetes_review
from megdet.controller.progress_ca import ServingCert, register, service_hosts
from megdet.controller.progress_hub import (
    ProgressHub,
    kubernetes_event_poster,
    register_forget,
)
from megdet.controller.progress_server import ProgressServer

__all__ = ["ProgressService", "start"]

logger = logging.getLogger(__name__)


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
    cert = ServingCert.from_dir(cert_dir) if cert_dir else ServingCert.generate(service_hosts(url))
    cluster = Cluster(api_client, timeout=timeout)
    hub = ProgressHub(
        cluster.get_run,
        lambda ns, name, status: cluster.patch_run_status(ns, name, status),
        kubernetes_event_poster(api_client, timeout, instance),
        interval=interval,
        checkpoint_every=checkpoint_every,
    )
    register_forget(registry, hub)  # a deleted run's progress state goes with it
    # The audience is the run's own, so only pods whose spec asks for it hold such a token;
    # like Trainer's status server, no pod is read (the controller needs no `get pods`).
    auth = RunAuthenticator(kubernetes_review(api_client, timeout))
    server = ProgressServer((addr, port), hub, auth, cert.context)
    service = ProgressService(server, hub, cert)
    register(registry, api_client, timeout, cert.ca_pem)
    service.start()
    logger.info("progress: serving https://%s:%d (reports every %gs at most)", addr, port, interval)
    return service
