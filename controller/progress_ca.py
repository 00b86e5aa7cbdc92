"""The progress endpoint's certificate, and its CA published where the run's pods read it.

:class:`ServingCert` comes from ``--progress-cert-dir``, or from the Secret
``--progress-ca-secret`` the replicas share (:meth:`ServingCert.shared`: the first replica that
finds none creates it), or is made at start for this process only. :class:`CAKeeper` keeps the
CA in each ``target: pytorchjob`` run's namespace as ConfigMap ``megdet-progress-ca`` (key
``ca.crt``, mounted by the run chart), from a watch of those ConfigMaps: one missing or changed
is written at once, nothing while they are right; every replica keeps them, with the same CA.
docs/operations.md, "Progress reporting".
"""

from __future__ import annotations

import base64
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
    "ca_config_map",
    "service_hosts",
]

#: Key of the CA in the ConfigMap (Trainer's own ConfigMap uses the same).
CA_KEY = "ca.crt"
#: The ConfigMap holding the endpoint's CA, one per namespace with runs, shared by its runs
#: (public data). One fixed name, so the controller's RBAC names it: it may read and update
#: only this ConfigMap of a namespace, not any other (EKS's aws-auth is a ConfigMap).
CA_CONFIG_MAP = "megdet-progress-ca"

logger = logging.getLogger(__name__)


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

    @classmethod
    def shared(
        cls, api_client: Any, timeout: float, namespace: str, name: str, hosts: list[str]
    ) -> ServingCert:
        """The certificate in the Secret ``namespace/name`` (``ca.crt``, ``tls.crt``,
        ``tls.key``), created with a fresh CA and certificate for ``hosts`` if there is none.
        Two replicas starting together both try to create it; the API server keeps one (409
        for the other, which then reads it), so both serve the same certificate."""
        from kubernetes import client as k8s

        core = k8s.CoreV1Api(api_client)
        try:
            found = core.read_namespaced_secret(name, namespace, _request_timeout=timeout)
        except k8s.ApiException as err:
            if err.status != 404:
                raise
            found = None
        if found is None:
            ca_pem, cert_pem, key_pem = ca_and_serving_cert(
                hosts, ca_name="megdet-progress-ca", leaf_name="megdet-progress"
            )
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
                    for key, pem in ((CA_KEY, ca_pem), ("tls.crt", cert_pem), ("tls.key", key_pem))
                },
            }
            try:
                core.create_namespaced_secret(namespace, body, _request_timeout=timeout)
                logger.info("progress: created the CA Secret %s/%s", namespace, name)
                return cls(context_from_pem(cert_pem + ca_pem, key_pem), ca_pem.decode())
            except k8s.ApiException as err:
                if err.status != 409:
                    raise
            found = core.read_namespaced_secret(name, namespace, _request_timeout=timeout)
        data = found.data or {}
        try:
            ca_pem, cert_pem, key_pem = (
                base64.b64decode(data[k]) for k in (CA_KEY, "tls.crt", "tls.key")
            )
            context = context_from_pem(cert_pem + ca_pem, key_pem)
        except (KeyError, ValueError, ssl.SSLError) as err:
            raise ValueError(
                f"--progress-ca-secret {namespace}/{name}: needs {CA_KEY}, tls.crt and tls.key "
                f"that load ({type(err).__name__}: {err}); delete it to have a new one made"
            ) from None
        return cls(context, ca_pem.decode())


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


class CAKeeper:
    """Keeps ``megdet-progress-ca`` right in every namespace the CA was published to.

    A namespace editor may change or delete that ConfigMap (``edit`` covers ConfigMaps); the
    pods would then trust another CA, or none. A watch of the ConfigMaps of that one name
    (:meth:`watch`; RBAC lets the controller list and watch no other) hears of it, and the CA
    is written back at once: level-triggered (every list and every event is compared with the
    CA), no request while they are right. ``write(namespace, found)`` creates (``found`` None)
    or patches the ConfigMap.
    """

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
        self.watches: list[Any] = []

    def publish(self, namespace: str) -> None:
        """``namespace`` has a ``target: pytorchjob`` run: its ConfigMap is made at the next
        :meth:`resync` and kept from then on."""
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
        """Compare every kept namespace with what the watch last saw, and write what is missing
        or wrong (the service's thread calls it twice a second: no request while all is
        right). Namespaces whose watch has not listed yet wait for it."""
        with self._lock:
            namespaces = [
                ns for ns in sorted(self.published) if None in self.listed or ns in self.listed
            ]
        for ns in namespaces:
            self._keep(ns)

    def _keep(self, namespace: str) -> None:
        """Write the namespace's ConfigMap if what the watch last saw of it is missing or
        wrong. One at a time (the watch thread and the service's thread both call it), each
        deciding on the latest view, so one change costs one write."""
        with self._write_lock:
            self._keep_locked(namespace)

    def _keep_locked(self, namespace: str) -> None:
        with self._lock:
            found = self.seen.get(namespace)
        if found is not None and (found.get("data") or {}).get(CA_KEY) == self.ca_pem:
            with self._lock:
                self.kept.add(namespace)
            return
        try:
            self.write(namespace, found)
        except Exception as err:  # the next event or resync tries again
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

    def watch(self, api_client: Any, timeout: float, namespaces: list[str]) -> CAKeeper:
        """Start a watch of the ConfigMaps named ``megdet-progress-ca``: in all namespaces, or
        in each of ``namespaces`` (a controller serving only those)."""
        from kubernetes import client as k8s

        from megdet.controller.progress_watch import ListWatch, lister, named

        core = k8s.CoreV1Api(api_client)
        for namespace in namespaces or [None]:
            list_fn = lister(core.list_config_map_for_all_namespaces,
                             core.list_namespaced_config_map, namespace)  # fmt: skip

            def on_list(items: list[dict[str, Any]], ns: str | None = namespace) -> None:
                self.on_list(items, ns)

            self.watches.append(
                ListWatch(
                    list_fn, on_list, self.on_event, keep=named(CA_CONFIG_MAP),
                    selectors={"field_selector": f"metadata.name={CA_CONFIG_MAP}"},
                    timeout=timeout, what=f"ConfigMaps {CA_CONFIG_MAP}",
                ).start()
            )  # fmt: skip
        return self

    def stop(self) -> None:
        for w in self.watches:
            w.stop()


def kubernetes_ca_writer(
    api_client: Any, timeout: float, ca_pem: str
) -> Callable[[str, Mapping[str, Any] | None], Any]:
    """``write(namespace, found)`` for :class:`CAKeeper`: create the ConfigMap when it is gone,
    else merge-patch its ``ca.crt`` back."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api_client)

    def write(namespace: str, found: Mapping[str, Any] | None) -> Any:
        if found is None:
            try:
                return core.create_namespaced_config_map(
                    namespace, ca_config_map(namespace, ca_pem), _request_timeout=timeout
                )
            except k8s.ApiException as err:
                if err.status != 409:
                    raise
        return core.patch_namespaced_config_map(
            CA_CONFIG_MAP, namespace, {"data": {CA_KEY: ca_pem}}, _request_timeout=timeout
        )

    return write
