"""Handler-level fuzz: the reconcile's pure part on >= 1000 generated MegDetRuns.

``plan_children`` (the operator's values refused, one render, adopt) and the status it leads
to (``invalid_status`` or ``planned_status``) are what the kopf handler runs between its API
calls (the ``Cluster`` seam). For any run body they must not raise, every refusal must name a
field, and every accepted run must yield exactly one owned job of a known kind plus a status
with the plan. validate_run's own verdicts are fuzzed in test_validation.py; this is the
handler's path.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from megdet.controller.api import JOB_KINDS
from megdet.controller.planning import Invalid, Planned, plan_children
from megdet.controller.status import Created, SpecInvalid, desired_status

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
