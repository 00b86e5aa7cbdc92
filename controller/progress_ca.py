"""The progress endpoint's certificate, and its CA published where the run's pods read it.

A self-signed CA and serving certificate are made at start (or read from
``--progress-cert-dir``: :class:`ServingCert`); the CA is published in each ``target:
pytorchjob`` run's namespace as ConfigMap ``megdet-progress-ca`` (key ``ca.crt``), which the run
chart mounts next to the token (:func:`register`: kopf handlers on create and resume).
"""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megdet.controller.api import GROUP, PLURAL, VERSION
from megdet.controller.tls import ca_and_serving_cert, context_from_dir, context_from_pem

__all__ = [
    "CA_CONFIG_MAP",
    "CA_KEY",
    "ServingCert",
    "ca_config_map",
    "publish_ca",
    "register",
    "service_hosts",
]

#: Key of the CA in the ConfigMap (Trainer's own ConfigMap uses the same).
CA_KEY = "ca.crt"
#: The ConfigMap holding the endpoint's CA, one per namespace with runs, shared by its runs
#: (public data). One fixed name, so the controller's RBAC names it: it may read and update
#: only this ConfigMap of a namespace, not any other (EKS's aws-auth is a ConfigMap).
CA_CONFIG_MAP = "megdet-progress-ca"


def ca_config_map(namespace: str, ca_pem: str) -> dict[str, Any]:
    """The CA ConfigMap of a namespace (the same for every run of it)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": CA_CONFIG_MAP,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "megdet"},
        },
        "data": {CA_KEY: ca_pem},
    }


@dataclass(frozen=True)
class ServingCert:
    """The endpoint's TLS context and the CA (PEM) that clients verify it with."""

    context: ssl.SSLContext
    ca_pem: str

    @classmethod
    def generate(cls, hosts: list[str]) -> ServingCert:
        """A fresh CA and a serving certificate for ``hosts`` (and localhost, 127.0.0.1)."""
        ca_pem, cert_pem, key_pem = ca_and_serving_cert(
            hosts, ca_name="megdet-progress-ca", leaf_name="megdet-progress"
        )
        return cls(context_from_pem(cert_pem + ca_pem, key_pem), ca_pem.decode())

    @classmethod
    def from_dir(cls, cert_dir: str | Path) -> ServingCert:
        """``tls.crt``, ``tls.key`` and ``ca.crt`` (a cert-manager Secret's keys; without
        ``ca.crt`` the certificate itself is the CA)."""
        folder = Path(cert_dir)
        try:
            context = context_from_dir(folder)
        except ValueError as err:
            raise ValueError(f"--progress-cert-dir: {err}") from None
        ca = folder / CA_KEY
        return cls(context, (ca if ca.is_file() else folder / "tls.crt").read_text())


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


def publish_ca(api_client: Any, timeout: float, run: Mapping[str, Any], ca_pem: str) -> None:
    """Create or update the ``megdet-progress-ca`` ConfigMap in the run's namespace. It is
    shared by the namespace's runs and owned by none: deleting a run leaves it for the others."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api_client)
    namespace = (run.get("metadata") or {})["namespace"]
    wanted = ca_config_map(namespace, ca_pem)
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
        on(GROUP, VERSION, PLURAL, registry=registry, id="progress-ca")(publish)
