"""Operator chart: helm lint strict and kubernetes-validate --strict for built-in kinds."""

from __future__ import annotations

import copy

import helm_python
import kubernetes_validate
import pytest
import yaml
from operator_chart_helpers import CHART_DIR, CI_VALUES, NAMESPACE, render, values_file

K8S_VERSIONS = ("1.28.0", "1.34.0")  # Chart.yaml: kubeVersion >=1.28
CUSTOM_GROUPS = ("kopf.dev/", "monitoring.coreos.com/", "megdet.io/")
#: ValidatingAdmissionPolicy is GA (admissionregistration.k8s.io/v1) from Kubernetes 1.30.
ADMISSION_POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
CASES = {
    "defaults": {},
    "serviceMonitor": {"serviceMonitor": {"enabled": True}},
    **{p.name: values_file(p) for p in CI_VALUES},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lint_strict_reports_no_errors(case) -> None:
    report = helm_python.lint(str(CHART_DIR), CASES[case], strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] > 1] == []  # info ("icon") only


def test_lint_reports_bad_values() -> None:
    # Guards the test above: the same call does report a values problem.
    report = helm_python.lint(str(CHART_DIR), {"replicaCount": "two"}, strict=True)
    assert report["errors"] or any(m["severity"] > 1 for m in report["messages"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_builtin_objects_pass_kubernetes_validate_strict(case) -> None:
    objects = [
        o for o in render(CASES[case]).objects if not o["apiVersion"].startswith(CUSTOM_GROUPS)
    ]
    kinds = {o["kind"] for o in objects}
    assert kinds >= {"Deployment", "Service"}
    assert kinds & {"ClusterRole", "Role"}  # one or the other: watchNamespaces decides
    for obj in objects:
        for version in K8S_VERSIONS:
            if obj["kind"] in ADMISSION_POLICY_KINDS and version < "1.30":
                continue  # GA in 1.30; older clusters install with policy.admission.enabled=false
            kubernetes_validate.validate(obj, version, strict=True)


def test_without_admission_policies_the_objects_pass_on_the_oldest_version() -> None:
    objects = [
        o
        for o in render({"policy": {"admission": {"enabled": False}}}).objects
        if not o["apiVersion"].startswith(CUSTOM_GROUPS)
    ]
    assert not {o["kind"] for o in objects} & ADMISSION_POLICY_KINDS
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSIONS[0], strict=True)


def test_kubernetes_validate_strict_catches_a_typo_in_the_deployment() -> None:
    deployment = copy.deepcopy(render().one("Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize(
    ("name", "scope"),
    [("clusterkopfpeerings.kopf.dev", "Cluster"), ("kopfpeerings.kopf.dev", "Namespaced")],
)
def test_peering_crds_are_valid_apiextensions_objects(name: str, scope: str) -> None:
    crd = yaml.safe_load((CHART_DIR / "crds" / f"{name}.yaml").read_text())
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(crd, version, strict=True)
    assert crd["metadata"]["name"] == name
    assert crd["spec"]["scope"] == scope
    (served,) = crd["spec"]["versions"]
    # kopf patches the peering status through the object itself: no status subresource.
    assert "subresources" not in served


def _properties(schema: dict, path: str = ""):
    for key, sub in (schema.get("properties") or {}).items():
        yield f"{path}{key}", sub
        yield from _properties(sub, f"{path}{key}.")
    if isinstance(schema.get("items"), dict):
        yield from _properties(schema["items"], f"{path}[].")


def test_values_schema_describes_every_value_and_refuses_unknown_keys() -> None:
    import json

    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    missing = [path for path, sub in _properties(schema) if not sub.get("description")]
    assert missing == []
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])


def test_the_megdetrun_crd_needs_1_28() -> None:
    """The chart's floor is the CRD's: its CEL rules carry `reason` and `fieldPath`, which
    apiextensions.k8s.io/v1 has from 1.28. The real 1.36 server accepts the CRD
    (tests/e2e/test_operator_install.py); kubernetes-validate checks the older schemas."""
    crd = yaml.safe_load((CHART_DIR / "crds" / "megdetruns.megdet.io.yaml").read_text())
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.28.0-0"
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(crd, version, strict=True)
    with pytest.raises(kubernetes_validate.ValidationError, match="x-kubernetes-validations"):
        kubernetes_validate.validate(crd, "1.27.0", strict=True)
