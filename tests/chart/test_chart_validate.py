"""Rendered objects pass the validators a cluster would apply: kubernetes-validate --strict for
built-in kinds, the project's PyTorchJob v1 schema, the operator's webhook rules, helm lint."""

from __future__ import annotations

import copy
import json
import re

import helm_python
import jsonschema
import kubernetes_validate
import pytest
from chart_helpers import CHART_DIR, CI_VALUES, SCHEMAS, values_file, values_from

# Chart.yaml says kubeVersion >=1.27; validate at that floor and at the newest schema shipped.
K8S_VERSIONS = ("1.27.0", "1.34.0")
CUSTOM_GROUPS = ("kubeflow.org/",)

CASES = {
    "defaults": {},
    "gpus=1": values_from(sets=["gpus=1"]),
    "gpus=64-ib-hostnet-gang": values_from(
        sets=[
            "gpus=64",
            "nccl.ib.enabled=true",
            "nccl.ib.rdmaResourceName=rdma/rdma_shared_device_a",
            "network.hostNetwork=true",
            "gang.enabled=true",
        ]
    ),
    "networkpolicy-restricted-egress": values_from(
        sets=["gpus=16", "networkPolicy.enabled=true", "networkPolicy.restrictEgress=true"]
    ),
    "security-overrides": values_from(
        sets=[
            "containerSecurityContext.readOnlyRootFilesystem=true",
            "containerSecurityContext.capabilities.add={NET_BIND_SERVICE}",
            "podSecurityContext.seccompProfile.type=Localhost",
            "podSecurityContext.seccompProfile.localhostProfile=profiles/megdet.json",
        ]
    ),
    **{p.name: values_file(p) for p in CI_VALUES},
}


@pytest.fixture(scope="module")
def pytorchjob_schema() -> dict:
    schema = json.loads((SCHEMAS / "pytorchjob-v1.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def as_pod_template(job: dict, role: str) -> dict:
    """A replica's pod template as a core/v1 PodTemplate, which kubernetes-validate knows."""
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": f"{job['metadata']['name']}-{role.lower()}"},
        "template": job["spec"]["pytorchReplicaSpecs"][role]["template"],
    }


def builtin_objects(rendered) -> list[dict]:
    """Every built-in object: rendered ones plus each replica's pod template."""
    out = [o for o in rendered.objects if not o["apiVersion"].startswith(CUSTOM_GROUPS)]
    job = rendered.job
    out += [as_pod_template(job, role) for role in job["spec"]["pytorchReplicaSpecs"]]
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_builtin_objects_pass_kubernetes_validate_strict(render, case):
    rendered = render(CASES[case])
    objects = builtin_objects(rendered)
    assert len(objects) >= 1
    for obj in objects:
        for version in K8S_VERSIONS:
            # Raises ValidationError (a typo, a wrong type) or SchemaNotFoundError (a kind the
            # cluster does not know): both fail the test.
            kubernetes_validate.validate(obj, version, strict=True)


def test_kubernetes_validate_strict_catches_a_typo_in_the_pod_template(render):
    # Guards the check above: strict mode must reject an unknown field in a pod spec.
    template = as_pod_template(render({}).job, "Master")
    template["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(template, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("case", list(CASES))
def test_pytorchjob_passes_schema_and_operator_rules(render, pytorchjob_schema, case):
    job = render(CASES[case]).job
    jsonschema.validate(job, pytorchjob_schema, cls=jsonschema.Draft202012Validator)
    # The training operator's webhook rules for kubeflow.org/v1 PyTorchJob.
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1
    assert set(specs) <= {"Master", "Worker"}
    for role, spec in specs.items():
        names = [c["name"] for c in spec["template"]["spec"]["containers"]]
        assert names.count("pytorch") == 1, role


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("spec", "nprocPerNode"), 8, "is not of type 'string'"),
        (("spec", "runPolicy", "backofLimit"), 3, "'backofLimit' was unexpected"),
        (("spec", "pytorchReplicaSpecs", "Launcher"), {}, "'Launcher' was unexpected"),
        (("spec", "runPolicy", "cleanPodPolicy"), "Always", "is not one of"),
    ],
)
def test_pytorchjob_schema_rejects_mistakes(render, pytorchjob_schema, path, value, message):
    job = copy.deepcopy(render({}).job)
    node = job
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError, match=re.escape(message)):
        jsonschema.validate(job, pytorchjob_schema, cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize(
    "case", ["defaults", "networkpolicy-restricted-egress", *(p.name for p in CI_VALUES)]
)
def test_lint_strict_reports_no_errors_or_warnings(case):
    report = helm_python.lint(str(CHART_DIR), CASES[case], strict=True, namespace="vision")
    assert report["errors"] == []
    # severity: 1 info, 2 warning, 3 error; strict treats warnings as failures too.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_reports_bad_values():
    # Guards the lint test: the same call does report a values problem. (helm lint ignores
    # `fail` in templates by design, so the cross-field rules are tested by rendering.)
    report = helm_python.lint(str(CHART_DIR), {"gpus": "x"}, strict=True)
    assert any("at '/gpus': got string, want integer" in e for e in report["errors"])
