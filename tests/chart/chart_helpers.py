"""Render the megdet chart with the real Helm engine (helm-python-sdk) and pick objects apart.

`helm install -f a.yaml -f b.yaml --set x=1` merges its value layers before rendering; the SDK's
``render()`` takes one dict, so :func:`merge_values` does that merge here, the same way
(maps merge key by key, anything else replaces, a later layer wins).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import pytest

from megdet.controller.render import split_manifests

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "megdet"
ALL_CI_VALUES = sorted((CHART_DIR / "ci").glob("*-values.yaml"))
# ci/trainjob-*-values.yaml set target=trainjob (tests/chart/test_chart_trainjob.py renders every
# file with both targets); the PyTorchJob tests take the others.
TRAINJOB_CI_VALUES = [p for p in ALL_CI_VALUES if p.name.startswith("trainjob-")]
CI_VALUES = [p for p in ALL_CI_VALUES if p not in TRAINJOB_CI_VALUES]
SCHEMAS = REPO / "tests" / "schemas"
RELEASE = "megdet"
NAMESPACE = "vision"

# The container securityContext the chart renders by default (the restricted Pod Security
# Standard's container fields), and with nccl.ib.memlock=root: uid 0 with IPC_LOCK on top of the
# runtime's default capabilities but NET_RAW (drop ALL taken out), which only the privileged level
# allows.
RESTRICTED_CONTAINER_SECURITY = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
ROOT_CONTAINER_SECURITY = {
    "runAsUser": 0,
    "runAsNonRoot": False,
    "allowPrivilegeEscalation": False,
    "capabilities": {"add": ["IPC_LOCK"], "drop": ["NET_RAW"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def merge_values(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Merge value layers like Helm does for -f files and --set: later layers win."""
    out: dict[str, Any] = {}
    for layer in layers:
        _merge_into(out, layer)
    return out


def _merge_into(base: dict[str, Any], layer: Mapping[str, Any]) -> None:
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge_into(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def values_file(path: Path) -> dict[str, Any]:
    """A values file, parsed the way `helm -f` parses it."""
    return helm_python.values_from_yaml(path.read_text())


def values_from(files: Iterable[Path] = (), sets: Iterable[str] = (), **extra: Any) -> dict:
    """`-f FILE ... --set EXPR ...` as one values dict; keyword arguments are a last layer."""
    layers = [values_file(f) for f in files]
    layers += [helm_python.parse_set_string(s) for s in sets]
    layers.append(extra)
    return merge_values(*layers)


@dataclass
class Rendered:
    """One rendered release: the manifests as objects and the NOTES text."""

    objects: list[dict[str, Any]]
    notes: str
    values: dict[str, Any]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    @property
    def job(self) -> dict[str, Any]:
        jobs = self.of_kind("PyTorchJob")
        assert len(jobs) == 1, f"expected one PyTorchJob, got {len(jobs)}"
        return jobs[0]

    def replicas(self) -> dict[str, dict[str, Any]]:
        return self.job["spec"]["pytorchReplicaSpecs"]

    def pod_specs(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for role, replica in self.replicas().items():
            yield role, replica["template"]["spec"]

    def containers(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for role, spec in self.pod_specs():
            for container in spec["containers"]:
                yield role, container


class Renderer:
    """Renders the chart, loaded once per test session."""

    def __init__(self, chart: helm_python.Chart) -> None:
        self.chart = chart

    def __call__(self, values: Mapping[str, Any] | None = None) -> Rendered:
        files = self.chart.render(
            values=dict(values or {}), name=RELEASE, namespace=NAMESPACE, is_install=True
        )
        objects, notes = split_manifests(files)
        return Rendered(objects=objects, notes=notes, values=self.chart.merge_values(values))

    def error(self, values: Mapping[str, Any]) -> str:
        """The engine's message for values it must reject (fails the test if it renders)."""
        with pytest.raises(helm_python.HelmError) as excinfo:
            self(values)
        return str(excinfo.value)


@pytest.fixture(scope="session")
def render() -> Iterator[Renderer]:
    with helm_python.Chart.load(str(CHART_DIR)) as chart:
        yield Renderer(chart)


def env_of(container: Mapping[str, Any]) -> dict[str, str]:
    """A container's literal env as a dict (valueFrom entries map to None)."""
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def overrides_of(args: list[str]) -> dict[str, str]:
    """The trainer's trailing KEY VALUE overrides (after the last --flag and its value)."""
    last_flag = max(i for i, a in enumerate(args) if a.startswith("--"))
    tail = args[last_flag + 2 :]
    assert len(tail) % 2 == 0, f"odd number of override words: {tail}"
    return dict(zip(tail[::2], tail[1::2], strict=True))


def flags_of(args: list[str]) -> dict[str, str]:
    """The trainer's --flag VALUE pairs."""
    return {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--")}


def qos_class(*containers: Mapping[str, Any]) -> str:
    """The pod QoS class Kubernetes assigns (pkg/apis/core/v1/helper/qos): Guaranteed when every
    container has CPU and memory limits equal to its requests, BestEffort with neither."""
    if all(not c.get("resources", {}).get(k) for c in containers for k in ("requests", "limits")):
        return "BestEffort"
    for c in containers:
        requests = c.get("resources", {}).get("requests", {})
        limits = c.get("resources", {}).get("limits", {})
        for kind in ("cpu", "memory"):
            if kind not in limits or requests.get(kind, limits[kind]) != limits[kind]:
                return "Burstable"
    return "Guaranteed"


def diff_paths(a: Any, b: Any, path: tuple = ()) -> set[tuple]:
    """Paths where two JSON-like documents differ (a missing key differs from any value)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: set[tuple] = set()
        for key in a.keys() | b.keys():
            if key not in a or key not in b:
                out.add((*path, key))
            else:
                out |= diff_paths(a[key], b[key], (*path, key))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return set().union(
            *(diff_paths(x, y, (*path, i)) for i, (x, y) in enumerate(zip(a, b, strict=True)))
        )
    return set() if a == b else {path}
