"""NetworkPolicy rules evaluated as the API defines them (kubernetes/website
content/en/docs/concepts/services-networking/network-policies.md), for the charts' tests: who
may reach a selected pod, or be reached by it, on which port. Pods and namespaces are given by
their labels; a namespace's labels include kubernetes.io/metadata.name, as the API server sets
it. Only what the charts render is supported: matchLabels selectors, pod and namespace peers
(an ipBlock peer matches no pod)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["egress_allowed", "ingress_allowed", "namespace", "selects"]


def namespace(name: str) -> dict[str, str]:
    """A namespace's labels (the one the API server sets)."""
    return {"kubernetes.io/metadata.name": name}


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector with matchLabels only; {} selects everything."""
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer_matches(peer: Mapping[str, Any], pod, ns, own_ns: Mapping[str, str]) -> bool:
    if "ipBlock" in peer:
        return False
    pod_ok = selects(peer["podSelector"], pod) if "podSelector" in peer else True
    # A podSelector alone means the policy's own namespace.
    ns_ok = selects(peer["namespaceSelector"], ns) if "namespaceSelector" in peer else ns == own_ns
    return pod_ok and ns_ok


def _port_matches(ports: list[dict[str, Any]] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True
    return any(p.get("protocol", "TCP") == protocol and p.get("port", port) == port for p in ports)


def _allowed(policy: Mapping[str, Any], key: str, peers: str, pod, ns, port, protocol) -> bool:
    own_ns = namespace(policy["metadata"]["namespace"])
    return any(
        (not rule.get(peers) or any(_peer_matches(p, pod, ns, own_ns) for p in rule[peers]))
        and _port_matches(rule.get("ports"), port, protocol)
        for rule in policy["spec"].get(key) or []
    )


def ingress_allowed(policy: Mapping, src_pod: Mapping, src_ns: Mapping, port: int, proto="TCP"):
    """Whether a pod (labels) in a namespace (labels) may connect to the selected pods."""
    return _allowed(policy, "ingress", "from", src_pod, src_ns, port, proto)


def egress_allowed(policy: Mapping, dst_pod: Mapping, dst_ns: Mapping, port: int, proto="TCP"):
    """Whether the selected pods may connect to a pod (labels) in a namespace (labels)."""
    if "Egress" not in policy["spec"]["policyTypes"]:
        return True
    return _allowed(policy, "egress", "to", dst_pod, dst_ns, port, proto)
