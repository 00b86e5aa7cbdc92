"""The operator chart's `policy` values: the controller's policy file, the admission policy and
the grant for privileged knobs (rendered with the real Helm engine). The API server's verdicts
on them are in tests/e2e/test_e2e_policy.py."""

from __future__ import annotations

import json

import yaml
from operator_chart_helpers import CHART_DIR, RELEASE, render, render_error

from megdet.api.admission import match_conditions, validations
from megdet.api.crd import spec_schema
from megdet.policy import Policy

FULLNAME = RELEASE


def policy_file(values: dict | None = None) -> Policy:
    config = render(values).named("ConfigMap", f"{FULLNAME}-policy")
    return Policy.from_values(json.loads(config["data"]["policy.json"]))


def test_the_controller_reads_the_values_policy_from_a_configmap_it_mounts() -> None:
    assert policy_file() == Policy()
    changed = policy_file(
        {"policy": {"imageRepositories": ["registry.corp/"], "privileged": {"hostPath": True}}}
    )
    assert changed.imageRepositories == ("registry.corp/",) and changed.privileged.hostPath
    deploy = render().one("Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--policy-file=/etc/megdet/policy/policy.json" in container["args"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "policy")
    assert mount["mountPath"] == "/etc/megdet/policy" and mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == "policy")
    assert volume["configMap"]["name"] == f"{FULLNAME}-policy"


def test_a_changed_policy_rolls_the_controller() -> None:
    def checksum(values: dict | None) -> str:
        meta = render(values).one("Deployment")["spec"]["template"]["metadata"]
        return meta["annotations"]["checksum/policy"]

    assert checksum(None) == checksum({"podAnnotations": {"a": "b"}})
    assert checksum(None) != checksum({"policy": {"secretRefs": True}})


def test_the_admission_policy_carries_the_generated_rules_and_the_values() -> None:
    rendered = render({"policy": {"queues": ["team-a"], "requireQueue": True}})
    vap = rendered.named("ValidatingAdmissionPolicy", f"{FULLNAME}-runs")
    spec = vap["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["validations"] == validations()
    rules = spec["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": ["megdet.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["megdetruns"],
        }
    ]
    # Only a written spec is checked (beyond suspend): the controller's metadata writes pass.
    assert spec["matchConditions"] == match_conditions(spec_schema())
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    # Each policy value as a CEL literal (JSON is one), read by the validations.
    assert yaml.safe_load(variables["queues"]) == ["team-a"]
    assert variables["requireQueue"] == "true"
    assert json.loads(variables["privileged"]) == Policy().values()["privileged"]
    # unsafeWeights has no spec field to check: the controller applies it to every run.
    assert set(variables) == {*Policy().values(), "granted"} - {"unsafeWeights"}
    assert "subresource('privileged')" in variables["granted"]
    assert "check('use')" in variables["granted"]
    binding = rendered.named("ValidatingAdmissionPolicyBinding", f"{FULLNAME}-runs")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"]


def test_a_controller_serving_some_namespaces_gets_a_binding_for_those() -> None:
    binding = render({"controller": {"watchNamespaces": ["team-a", "team-b"]}}).named(
        "ValidatingAdmissionPolicyBinding", f"{FULLNAME}-runs"
    )
    (expr,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expr == {
        "key": "kubernetes.io/metadata.name",
        "operator": "In",
        "values": ["team-a", "team-b"],
    }


def test_the_privileged_grant_is_its_own_role_in_no_default_role() -> None:
    rendered = render()
    role = rendered.named("ClusterRole", f"{FULLNAME}-privileged")
    assert role["rules"] == [
        {"apiGroups": ["megdet.io"], "resources": ["megdetruns/privileged"], "verbs": ["use"]}
    ]
    assert not (role["metadata"].get("labels") or {}).keys() & {
        "rbac.authorization.k8s.io/aggregate-to-edit",
        "rbac.authorization.k8s.io/aggregate-to-admin",
    }
    for other in rendered.of_kind("ClusterRole"):
        if other is role:
            continue
        for rule in other.get("rules") or []:
            assert "megdetruns/privileged" not in rule.get("resources", []), other["metadata"]


def test_admission_off_renders_no_admission_policy_and_allows_no_privileged_knob() -> None:
    kinds = [o["kind"] for o in render({"policy": {"admission": {"enabled": False}}}).objects]
    assert "ValidatingAdmissionPolicy" not in kinds and "ConfigMap" in kinds
    error = render_error(
        {"policy": {"admission": {"enabled": False}, "privileged": {"ibRootMode": True}}}
    )
    assert "policy.privileged.ibRootMode=true needs policy.admission.enabled=true" in error


def test_bad_policy_values_are_refused_by_the_schema_naming_the_key() -> None:
    assert "policy" in render_error({"policy": {"registries": ["x/"]}})
    assert "registries" in render_error({"policy": {"registries": ["x/"]}})
    error = render_error({"policy": {"volumeTypes": ["emptyDir", "hostPath"]}})
    assert "volumeTypes" in error
    assert "secretRefs" in render_error({"policy": {"secretRefs": "no"}})


def test_the_values_file_documents_every_policy_key() -> None:
    text = (CHART_DIR / "values.yaml").read_text()
    block = text[text.index("\npolicy:") :]
    for key in Policy().values():
        assert f"  {key}:" in block, key
