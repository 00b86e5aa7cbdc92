"""The progress endpoint's certificate, and its CA kept in each pytorchjob run's namespace as
ConfigMap ``megdet-progress-ca``: docs/controller.md, "Progress reporting in detail" (TLS).
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megdet.controller.tls import ca_and_serving_cert, context_from_dir, context_from_pem

__all__ = [
    "CA_CONFIG_MAP",
    "CA_KEY",
    "CAKeeper",
    "ServingCert",
    "namespace_gone",
    "service_hosts",
]

#: Key of the CA in the ConfigMap (Trainer's own ConfigMap uses the same).
CA_KEY = "ca.crt"
#: The ConfigMap of the endpoint's CA in each namespace with runs; one fixed name, so the
#: controller's RBAC can name it and no other ConfigMap.
CA_CONFIG_MAP = "megdet-progress-ca"
#: The Secret's keys, in the order of ``ca_and_serving_cert``'s PEMs.
_SECRET_KEYS = (CA_KEY, "tls.crt", "tls.key")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServingCert:
    """The endpoint's TLS context and the CA (PEM) that clients verify it with."""

    context: ssl.SSLContext
    ca_pem: str

    @classmethod
    def generate(cls, hosts: list[str]) -> ServingCert:
        """A fresh CA and a serving certificate for ``hosts`` (and localhost, 127.0.0.1)."""
        return cls.from_pem(*_fresh(hosts))

    @classmethod
    def from_pem(cls, ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> ServingCert:
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

    @classmethod
    def shared(
        cls, api_client: Any, timeout: float, namespace: str, name: str, hosts: list[str]
    ) -> ServingCert:
        """The certificate in the Secret ``namespace/name``, which the first replica to find
        none creates for ``hosts`` (a create that answers 409 reads the winner's)."""
        from kubernetes import client as k8s

        core = k8s.CoreV1Api(api_client)
        try:
            found = core.read_namespaced_secret(name, namespace, _request_timeout=timeout)
        except k8s.ApiException as err:
            if err.status != 404:
                raise
            found = None
        if found is None:
            pems = _fresh(hosts)
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {"app.kubernetes.io/part-of": "megdet"},
                },
                "type": "kubernetes.io/tls",
                "data": {
                    key: base64.b64encode(pem).decode()
                    for key, pem in zip(_SECRET_KEYS, pems, strict=True)
                },
            }
            try:
                core.create_namespaced_secret(namespace, body, _request_timeout=timeout)
                logger.info("progress: created the CA Secret %s/%s", namespace, name)
                return cls.from_pem(*pems)
            except k8s.ApiException as err:
                if err.status != 409:
                    raise
            found = core.read_namespaced_secret(name, namespace, _request_timeout=timeout)
        data = found.data or {}
        try:
            return cls.from_pem(*(base64.b64decode(data[k]) for k in _SECRET_KEYS))
        except (KeyError, ValueError, ssl.SSLError) as err:
            raise ValueError(
                f"--progress-ca-secret {namespace}/{name}: needs {CA_KEY}, tls.crt and tls.key "
                f"that load ({type(err).__name__}: {err}); delete it to have a new one made"
            ) from None


def _fresh(hosts: list[str]) -> tuple[bytes, ...]:
    return ca_and_serving_cert(hosts, ca_name="megdet-progress-ca", leaf_name="megdet-progress")


def service_hosts(url: str) -> list[str]:
    """The names a Service URL's host is reached by (``svc.ns.svc``: ``svc``, ``svc.ns``...)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    hosts = [host]
    parts = host.split(".")
    if len(parts) >= 3 and parts[2] == "svc":
        service = ".".join(parts[:3])
        hosts += [parts[0], ".".join(parts[:2]), service, service + ".cluster.local"]
    return list(dict.fromkeys(h for h in hosts if h))


class CAKeeper:
    """Keeps ``megdet-progress-ca`` right in every namespace the CA was published to, from a
    watch of those ConfigMaps (level-triggered: no request while they are right).
    ``write(namespace, found)`` creates (``found`` None) or patches the ConfigMap."""

    def __init__(self, ca_pem: str, write: Callable[[str, Mapping[str, Any] | None], Any]) -> None:
        self.ca_pem = ca_pem
        self.write = write
        self.published: set[str] = set()
        self.seen: dict[str, Mapping[str, Any]] = {}
        #: The watches that have listed (None: all namespaces).
        self.listed: set[str | None] = set()
        #: Namespaces whose ConfigMap was seen or written right once.
        self.kept: set[str] = set()
        #: ConfigMaps made, written back, and watch events heard (for tests and logs).
        self.created = 0
        self.restored = 0
        self.events = 0
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()

    def publish(self, namespace: str) -> None:
        """``namespace`` has a ``target: pytorchjob`` run: keep its ConfigMap."""
        with self._lock:
            self.published.add(namespace)

    def on_list(self, items: list[dict[str, Any]], namespace: str | None = None) -> None:
        found = {(i.get("metadata") or {}).get("namespace"): i for i in items}
        with self._lock:
            self.listed.add(namespace)
            for ns in [n for n in self.seen if namespace is None or n == namespace]:
                del self.seen[ns]
            self.seen.update({ns: obj for ns, obj in found.items() if isinstance(ns, str)})
            namespaces = sorted(self.published if namespace is None else
                                self.published & {namespace})  # fmt: skip
        for ns in namespaces:
            self._keep(ns)

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        ns = (obj.get("metadata") or {}).get("namespace")
        if not isinstance(ns, str):
            return
        with self._lock:
            self.events += 1
            if kind == "DELETED":
                self.seen.pop(ns, None)
            else:
                self.seen[ns] = obj
            ours = ns in self.published
        if ours:
            self._keep(ns)

    def resync(self) -> None:
        """Write what the watch last saw missing or wrong in the listed namespaces kept."""
        with self._lock:
            namespaces = [
                ns for ns in sorted(self.published) if None in self.listed or ns in self.listed
            ]
        for ns in namespaces:
            self._keep(ns)

    def _keep(self, namespace: str) -> None:
        """Write the namespace's ConfigMap if what the watch last saw is missing or wrong."""
        with self._write_lock:
            with self._lock:
                found = self.seen.get(namespace)
                if found is not None and (found.get("data") or {}).get(CA_KEY) == self.ca_pem:
                    self.kept.add(namespace)
                    return
            try:
                self.write(namespace, found)
            except Exception as err:  # the next event or resync tries again
                if namespace_gone(err):  # kept again once a run is published there
                    with self._lock:
                        self.published.discard(namespace)
                        self.seen.pop(namespace, None)
                        self.kept.discard(namespace)
                    logger.info("progress: %s is gone or being deleted: its CA no longer kept",
                                namespace)  # fmt: skip
                    return
                logger.warning("progress: writing %s/%s: %s: %s", namespace, CA_CONFIG_MAP,
                               type(err).__name__, err)  # fmt: skip
                return
            with self._lock:
                first = namespace not in self.kept
                self.kept.add(namespace)
                # What was just written, until the watch reports it: the next resync writes nothing.
                self.seen[namespace] = {"data": {CA_KEY: self.ca_pem}}
        if found is None and first:
            self.created += 1
            logger.info("progress: published the endpoint's CA in %s/%s", namespace, CA_CONFIG_MAP)
            return
        self.restored += 1
        logger.warning(
            "progress: %s/%s %s; wrote the endpoint's CA back",
            namespace,
            CA_CONFIG_MAP,
            "was deleted" if found is None else "did not hold the endpoint's CA",
        )

    def watch(self, api_client: Any, timeout: float, namespaces: list[str]) -> list[Any]:
        """Start the watches of the ConfigMaps ``megdet-progress-ca`` in ``namespaces``."""
        from kubernetes import client as k8s

        from megdet.controller.progress_watch import named, watch_each

        core = k8s.CoreV1Api(api_client)
        return watch_each(
            namespaces, core.list_config_map_for_all_namespaces, core.list_namespaced_config_map,
            self.on_list, self.on_event, keep=named(CA_CONFIG_MAP),
            selectors={"field_selector": f"metadata.name={CA_CONFIG_MAP}"},
            timeout=timeout, what=f"ConfigMaps {CA_CONFIG_MAP}",
        )  # fmt: skip


def namespace_gone(err: Exception) -> bool:
    """Whether a write failed because its namespace does not exist (404 for the namespace) or
    is being deleted (403, cause ``NamespaceTerminating``): docs/controller.md, "Progress
    reporting in detail"."""
    try:
        details = json.loads(getattr(err, "body", None) or "{}").get("details") or {}
    except (ValueError, AttributeError):
        return False
    status, causes = getattr(err, "status", None), details.get("causes") or []
    terminating = any(isinstance(c, dict) and c.get("reason") == "NamespaceTerminating"
                      for c in causes)  # fmt: skip
    return (status == 404 and details.get("kind") == "namespaces") or (
        status == 403 and terminating
    )


def kubernetes_ca_writer(
    api_client: Any, timeout: float, ca_pem: str
) -> Callable[[str, Mapping[str, Any] | None], Any]:
    """``write(namespace, found)`` for :class:`CAKeeper`: create the ConfigMap, or patch it."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api_client)

    def write(namespace: str, found: Mapping[str, Any] | None) -> Any:
        if found is None:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": CA_CONFIG_MAP,
                    "namespace": namespace,
                    "labels": {"app.kubernetes.io/part-of": "megdet"},
                },
                "data": {CA_KEY: ca_pem},
            }
            try:
                return core.create_namespaced_config_map(namespace, body, _request_timeout=timeout)
            except k8s.ApiException as err:
                if err.status != 409:
                    raise
        return core.patch_namespaced_config_map(
            CA_CONFIG_MAP, namespace, {"data": {CA_KEY: ca_pem}}, _request_timeout=timeout
        )

    return write
