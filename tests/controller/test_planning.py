"""The controller's pure helpers for refused jobs, output folders and the run's env."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s

from megdet.controller.api import JOB_KINDS
from megdet.controller.kubeapi import refusal_message
from megdet.controller.planning import (
    RUN_ENV,
    Invalid,
    OutputClaim,
    Planned,
    controlled_by,
    output_claim,
    output_holder,
    output_location,
    plan_children,
    with_run_env,
)
from megdet.controller.status import Created, SpecInvalid, desired_status

JOB = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "r"}}


def api_error(code: int, body: Any) -> k8s.ApiException:
    err = k8s.ApiException(status=code, reason="Whatever")
    err.body = body if isinstance(body, str | bytes | None) else json.dumps(body)
    return err


def test_a_refusal_says_the_servers_message_its_causes_and_the_fix() -> None:
    body = {
        "kind": "Status",
        "code": 422,
        "reason": "Invalid",
        "message": 'PyTorchJob.kubeflow.org "r" is invalid: spec.x: Invalid value',
        "details": {
            "causes": [
                {"field": "spec.x", "message": "Invalid value"},
                {"field": "spec.y", "message": "Required value"},
                {"reason": "FieldValueForbidden"},
                "junk",
            ]
        },
    }
    text = refusal_message(JOB, api_error(422, body), 7)
    assert text.startswith("the API server refused to create PyTorchJob r (HTTP 422 Invalid): ")
    assert body["message"] in text
    assert "spec.y: Required value" in text and "FieldValueForbidden" in text
    assert text.count("spec.x: Invalid value") == 1  # already in the message: not repeated
    assert "metadata.generation 7" in text and "edit the spec" in text


@pytest.mark.parametrize("body", [None, "", "not json", b"\xff", "[1, 2]", '{"details": 3}'])
def test_a_refusal_with_an_unreadable_body_still_makes_a_message(body: Any) -> None:
    text = refusal_message(JOB, api_error(403, body), 1)
    assert "HTTP 403" in text and "PyTorchJob r" in text


def test_a_long_server_message_is_cut() -> None:
    text = refusal_message(JOB, api_error(400, {"message": "x" * 50_000}), 1)
    assert len(text) < 3000 and "edit the spec" in text


def test_run_env_is_appended_after_the_users_and_junk_is_left_for_validation() -> None:
    spec = {"gpus": 8, "extraEnv": [{"name": "A", "value": "1"}]}
    out = with_run_env(spec, "r", "u-1")
    assert out["extraEnv"] == [
        {"name": "A", "value": "1"},
        {"name": RUN_ENV[0], "value": "u-1"},
        {"name": RUN_ENV[1], "value": "r"},
    ]
    assert spec["extraEnv"] == [{"name": "A", "value": "1"}]  # not changed in place
    assert with_run_env({"gpus": 8}, "r", None)["extraEnv"] == [{"name": RUN_ENV[1], "value": "r"}]
    for junk in (None, 3, "x", {"extraEnv": "x"}, {"extraEnv": {"a": 1}}):
        assert with_run_env(junk, "r", "u") == junk


def test_planned_pods_get_the_runs_uid_and_name() -> None:
    run = {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {"name": "r", "namespace": "vision", "uid": "u-1", "generation": 1},
        "spec": {
            "gpus": 16,
            "gpusPerNode": 8,
            "extraEnv": [{"name": "MEGDET_RUN_NAME", "value": "x"}],
        },
    }
    planned = plan_children(run)
    assert isinstance(planned, Planned)
    for pod in planned.job["spec"]["pytorchReplicaSpecs"].values():
        (container,) = pod["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}  # the last of a name wins
        assert env["MEGDET_RUN_UID"] == "u-1" and env["MEGDET_RUN_NAME"] == "r"


def test_a_rendered_kind_outside_the_clusterrole_is_refused_the_job_too(monkeypatch) -> None:
    """An object of a kind (apiVersion and kind) the controller may not create, the job
    included, makes the run Invalid before anything is created (it would fail with 403)."""
    from megdet.controller import planning

    real = planning.render_run

    def render(name: str, namespace: str, spec: Any) -> Any:
        rendered = real(name, namespace, spec)
        job = {**rendered.job, "apiVersion": "kubeflow.org/v2"}
        return dataclasses.replace(rendered, objects=(job, *rendered.objects[1:]))

    monkeypatch.setattr(planning, "render_run", render)
    decision = plan_children(run("a", gpus=8))
    assert isinstance(decision, Invalid)
    assert decision.messages == [
        "spec: the chart rendered kinds the controller cannot own: ['PyTorchJob']"
    ]


def test_controlled_by_needs_the_controller_reference_to_the_uid() -> None:
    def job(**ref: Any) -> dict[str, Any]:
        return {"metadata": {"ownerReferences": [{"kind": "MegDetRun", "uid": "u", **ref}]}}

    assert controlled_by(job(controller=True), "u")
    assert not controlled_by(job(controller=False), "u")
    assert not controlled_by(job(), "u")
    assert not controlled_by(job(controller=True), "v")
    assert not controlled_by(job(controller=True), None)
    assert not controlled_by({"metadata": {"ownerReferences": "x"}}, "u")


def run(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, "spec": spec}


def test_output_location_is_claim_and_folder() -> None:
    assert output_location(run("a")) == ("ns", "megdet-output", "a")
    assert output_location(run("a", runName="base", output={"claimName": "pvc"})) == (
        "ns",
        "pvc",
        "base",
    )
    for junk in (run("a", output="x"), run("a", runName=3), {"metadata": 3}, {"spec": []}):
        assert output_location(junk) is None
        assert output_claim(junk) == {}


def claim(name: str, *, has_job: bool = False, live: bool = True, created: str = "") -> OutputClaim:
    return OutputClaim(name, f"uid-{name}", created, has_job, live, "Pending")


def test_output_holder_prefers_a_run_with_a_job_then_the_older() -> None:
    key = ("ns", "megdet-output", "shared")
    me = run("m", runName="shared")
    me["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
    assert output_holder({}, me) is None
    assert output_holder(None, me) is None
    older = claim("z", created="2026-01-01T00:00:00Z")
    newer = claim("a", created="2026-01-03T00:00:00Z")
    with_job = claim("y", has_job=True, created="2026-01-05T00:00:00Z")
    assert output_holder({key: [newer]}, me) is None
    assert output_holder({key: [newer, older]}, me) == older
    assert output_holder({key: [newer, older, with_job]}, me) == with_job
    assert output_holder({key: [claim("z", live=False, created="2020")]}, me) is None
    assert output_holder({key: [claim("m", has_job=True)]}, me) is None  # itself


def test_an_index_entry_says_whether_the_run_holds_its_folder() -> None:
    def entry(status: dict[str, Any], **meta: Any) -> OutputClaim:
        body = run("a")
        body["metadata"].update(meta)
        body["status"] = status
        (value,) = output_claim(body).values()
        return value

    created = {"type": "Created", "status": "True"}
    assert entry({}).live and not entry({}).has_job
    assert entry({"phase": "Running", "conditions": [created]}).has_job
    assert not entry({"phase": "Succeeded"}).live
    assert not entry({"phase": "Failed"}).live
    assert not entry({"phase": "Invalid"}).live
    assert entry({"phase": "Invalid", "conditions": [created]}).live
    assert not entry({}, deletionTimestamp="2026-01-01T00:00:00Z").live


@pytest.mark.parametrize(
    ("code", "message", "heals"),
    [
        (403, 'pytorchjobs.kubeflow.org "r" is forbidden: exceeded quota: q, requested: ...', True),
        (403, '"r" is forbidden: status unknown for quota: q, resource: count/pytorchjobs', True),
        (403, 'admission webhook "x" denied the request: TrainingRuntime "r" not found', True),
        (403, 'pytorchjobs.kubeflow.org is forbidden: User "u" cannot create resource "x"', True),
        (403, 'ValidatingAdmissionPolicy "cap" with binding "cap" denied request: too big', False),
        (422, 'PyTorchJob "r" is invalid: spec.x: not found', False),  # a verdict on the spec
        (400, 'admission webhook "x" denied the request: queue is immutable', False),
    ],
    ids=["quota", "quota-unknown", "webhook-cache", "rbac", "policy", "schema", "webhook-verdict"],
)
def test_only_refusals_that_heal_are_retried(code, message, heals) -> None:
    from megdet.controller.kubeapi import JobRefused, RefusalHeals, classify_refusal, heal_reason

    err = api_error(code, {"kind": "Status", "code": code, "reason": "X", "message": message})
    assert (heal_reason(err) is not None) is heals
    refusal = classify_refusal(JOB, err, 3)
    assert isinstance(refusal, RefusalHeals if heals else JobRefused)
    assert message in refusal.message
    assert ("Not final" in refusal.message) is heals
    assert ("Not retried until" in refusal.message) is not heals
    for code in (401, 404, 408, 409, 429, 500):  # not refusals: sorted elsewhere
        assert classify_refusal(JOB, api_error(code, {"message": message}), 3) is None


def test_merge_patch_turns_the_old_object_into_the_new_one() -> None:
    from megdet.controller.planning import digest_of, merge_patch, with_digest

    old = {"spec": {"policyTypes": ["Ingress", "Egress"], "egress": [1], "podSelector": {"a": 1}}}
    new = {"spec": {"policyTypes": ["Ingress"], "podSelector": {"b": 2}}}
    patch = merge_patch(old, new)
    assert patch == {"spec": {"egress": None, "policyTypes": ["Ingress"],
                              "podSelector": {"a": None, "b": 2}}}  # fmt: skip
    assert merge_patch(new, new) == {}
    policy = {"kind": "NetworkPolicy", "metadata": {"labels": {"x": "1"}}, "spec": new["spec"]}
    assert digest_of(policy) is None
    digested = with_digest(policy)
    assert digest_of(digested) and digest_of(digested) == digest_of(with_digest(digested))
    assert digest_of(with_digest({**policy, "spec": old["spec"]})) != digest_of(digested)
    assert "annotations" not in policy["metadata"]  # a copy


# ------------------------------------------------------------------------------------------
# Handler-level fuzz: the reconcile's pure part on >= 1000 generated MegDetRuns.
#
# ``plan_children`` (the operator's values refused, one render, adopt) and the status it leads
# to (``invalid_status`` or ``planned_status``) are what the kopf handler runs between its API
# calls (the ``Cluster`` seam). For any run body they must not raise, every refusal must name a
# field, and every accepted run must yield exactly one owned job of a known kind plus a status
# with the plan. validate_run's own verdicts are fuzzed in test_validation.py; this is the
# handler's path.


NOW = "2026-11-30T10:00:00Z"
UID = "0b6c3c4e-5a8e-4d1e-9a55-2f1f5d4f0c11"

# Values a user might plausibly type, and values nobody should.
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(-5, 200_000), max_size=4),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
)
gpus = st.one_of(st.sampled_from([1, 2, 4, 8, 16, 24, 32, 64, 12]), st.integers(-2, 200_000))
fields = {
    "gpus": gpus,
    "gpusPerNode": st.one_of(st.sampled_from([1, 4, 8]), junk),
    "imagesPerGpu": st.one_of(st.integers(1, 4), junk),
    "accumulationSteps": st.one_of(st.integers(1, 4), junk),
    "baseLr": st.one_of(st.sampled_from([0.02, 0.01, 0.1]), junk),
    "referenceBatch": st.one_of(st.sampled_from([16, 32]), junk),
    "scaling": st.one_of(st.sampled_from(["linear", "sqrt", "none"]), junk),
    "schedule": st.one_of(st.sampled_from(["step", "three-stage"]), junk),
    "maxIter": st.one_of(st.integers(1, 200_000), junk),
    "steps": st.one_of(st.just([60000, 80000]), junk),
    "warmupIters": st.one_of(st.integers(0, 2000), junk),
    "syncBN": st.one_of(st.sampled_from(["backbone", "all", "none"]), junk),
    "target": st.one_of(st.sampled_from(["pytorchjob", "trainjob"]), junk),
    "runPolicy": st.one_of(st.fixed_dictionaries({"suspend": st.booleans()}), junk),
    "nccl": st.one_of(
        st.fixed_dictionaries({"ib": st.fixed_dictionaries({"enabled": st.booleans()})}), junk
    ),
    "gang": st.one_of(st.fixed_dictionaries({"enabled": st.booleans()}), junk),
    "dataset": st.one_of(st.fixed_dictionaries({"claimName": st.sampled_from(["coco", ""])}), junk),
    "extraOverrides": st.one_of(
        st.dictionaries(
            st.sampled_from(["SOLVER.BASE_LR", "MODEL.RPN.NMS_THRESH"]), st.text(max_size=4)
        ),
        junk,
    ),
    "notAField": junk,
}
specs = st.one_of(
    st.fixed_dictionaries(
        {"gpus": gpus}, optional={k: v for k, v in fields.items() if k != "gpus"}
    ),
    junk,  # a spec that is not even an object
)
names = st.one_of(
    st.sampled_from(["run", "coco-64", "a" * 50, "a" * 51, "Bad_Name", ""]),
    st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True),
)


def body(name: str, spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {"name": name, "namespace": "vision", "uid": UID, "generation": 2},
        "spec": spec,
    }


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=names, spec=specs)
def test_reconcile_never_raises_and_every_refusal_names_a_field(name: str, spec: Any) -> None:
    run = body(name, spec)
    decision = plan_children(run)
    event(type(decision).__name__)  # --hypothesis-show-statistics: how many of each
    if isinstance(decision, Invalid):
        assert decision.problems
        for problem in decision.problems:
            assert problem.path.split(".")[0].split("[")[0] in ("spec", "metadata"), problem
            assert problem.message.strip(), problem
        status = desired_status(run, None, SpecInvalid(tuple(decision.messages)), NOW, 2)
        assert status["phase"] == "Invalid"
        assert status["conditions"][0]["message"].startswith(decision.problems[0].path)
        return
    assert isinstance(decision, Planned)
    job = decision.job
    assert job["kind"] in JOB_KINDS
    assert [o for o in decision.objects if o["kind"] in JOB_KINDS] == [job]
    for obj in decision.objects:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == UID and ref["controller"] is True
        assert obj["metadata"]["namespace"] == "vision"
    status = desired_status(run, job, Created(decision), NOW, 2)
    assert status["phase"] == "Pending" and status["jobName"] == job["metadata"]["name"]
    assert status["worldSize"] >= 1 and status["globalBatch"] >= 1
    assert math.isfinite(status["lr"]) and status["lr"] > 0
