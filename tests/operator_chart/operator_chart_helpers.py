"""Render charts/megdet-operator with the real Helm engine (helm-python-sdk).

A unique module name (not conftest) so that other test folders' helpers cannot shadow it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python

from megdet.controller.render import split_manifests

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "megdet-operator"
CI_VALUES = sorted((CHART_DIR / "ci").glob("*-values.yaml"))
CRDS = sorted((CHART_DIR / "crds").glob("*.yaml"))
RELEASE = "megdet-operator"
NAMESPACE = "megdet-system"


@dataclass
class Rendered:
    objects: list[dict[str, Any]]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_kind(kind)
        assert len(found) == 1, f"expected one {kind}, got {len(found)}"
        return found[0]

    def named(self, kind: str, name: str) -> dict[str, Any]:
        """The one ``kind`` object called ``name`` (several ClusterRoles render by default)."""
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, got {len(found)}"
        return found[0]

    def assert_granted(self, binding: dict[str, Any], role: dict[str, Any]) -> None:
        """``binding`` grants ``role`` (a ClusterRole or a Role) to the controller's
        ServiceAccount, and to nothing else."""
        account = self.one("ServiceAccount")["metadata"]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role["kind"],
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]


def values_file(path: Path) -> dict[str, Any]:
    return helm_python.values_from_yaml(path.read_text())


def render(values: dict[str, Any] | None = None, release: str = RELEASE) -> Rendered:
    """`helm template RELEASE charts/megdet-operator` with these values (schema enforced)."""
    with helm_python.Chart.load(str(CHART_DIR)) as chart:
        files = chart.render(
            values=values or {}, name=release, namespace=NAMESPACE, is_install=True
        )
    return Rendered(*split_manifests(files))


def render_error(values: dict[str, Any]) -> str:
    """The error text Helm gives for values it refuses."""
    try:
        render(values)
    except helm_python.HelmError as err:
        return str(err)
    raise AssertionError(f"values were accepted: {values}")
