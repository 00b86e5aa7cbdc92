"""NOTES.txt states the plan; every number in it equals megdet.plan.plan_run's for the values.

The chart has to compute these numbers in Go templates (Helm cannot call Python); these tests
are what keeps that arithmetic equal to the one source of truth.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex

import pytest
from chart_helpers import NAMESPACE, RELEASE, values_from
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megdet.cli import main as megdet_main
from megdet.plan import Plan, SpecError, plan_run

SPEC_KEYS = (
    "gpus",
    "gpusPerNode",
    "imagesPerGpu",
    "accumulationSteps",
    "baseLr",
    "referenceBatch",
    "scaling",
    "schedule",
    "maxIter",
    "steps",
    "warmupIters",
)

# gpus x imagesPerGpu x accumulation x scaling, plus cases with odd reference batches, base
# LRs and schedules, where rounding (round-half-up of iterations) and sqrt(k) are least trivial.
MATRIX = [
    {"gpus": g, "imagesPerGpu": i, "accumulationSteps": a, "scaling": s}
    for g, i, a, s in itertools.product(
        [1, 2, 8, 16, 64], [1, 2, 4], [1, 3], ["linear", "sqrt", "none"]
    )
] + [
    {"gpus": 3, "gpusPerNode": 4, "referenceBatch": 24, "scaling": "sqrt", "baseLr": 0.01},
    {
        "gpus": 6,
        "gpusPerNode": 6,
        "referenceBatch": 7,
        "maxIter": 1000,
        "steps": [333, 667],
        "warmupIters": 100,
    },
    {"gpus": 40, "gpusPerNode": 8, "imagesPerGpu": 3, "referenceBatch": 256, "scaling": "sqrt"},
    {"gpus": 128, "imagesPerGpu": 2, "referenceBatch": 16, "baseLr": 0.015, "scaling": "sqrt"},
    {"gpus": 16, "schedule": "three-stage", "scaling": "sqrt", "warmupIters": 0},
    {"gpus": 2, "maxIter": 5, "steps": [], "warmupIters": 1, "referenceBatch": 3},
    {
        "gpus": 1,
        "imagesPerGpu": 1,
        "referenceBatch": 1,
        "maxIter": 7,
        "steps": [3, 5],
        "warmupIters": 2,
    },
]


def ids(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case.items())


def notes_numbers(notes: str) -> dict:
    """The plan numbers NOTES.txt states."""

    def field(label: str) -> str:
        match = re.search(rf"^  {label}:\s+(.*)$", notes, re.MULTILINE)
        assert match, f"NOTES has no '{label}:' line:\n{notes}"
        return match.group(1)

    nodes = re.fullmatch(r"(\d+) \(1 Master \+ (\d+) Workers?\), (\d+) GPUs? each", field("nodes"))
    assert nodes, field("nodes")
    out = {
        "nodes": int(nodes.group(1)),
        "workers": int(nodes.group(2)),
        "procs_per_node": int(nodes.group(3)),
        "world_size": int(field("world size")),
        "global_batch": int(field("global batch").split()[0]),
        "lr": float(field("learning rate").split()[0]),
        "max_iter": int(field("max iter")),
    }
    step = re.fullmatch(r"step: warmup (\d+) iters, LR x gamma at ([\d, ]*)", field("schedule"))
    if step:
        out["warmup_iters"] = int(step.group(1))
        out["steps"] = [int(s) for s in step.group(2).split(",") if s.strip()]
    return out


def assert_notes_match_plan(notes: str, plan: Plan) -> None:
    got = notes_numbers(notes)
    assert got["nodes"] == plan.nodes
    assert got["workers"] == plan.nodes - 1
    assert got["procs_per_node"] == plan.procs_per_node
    assert got["world_size"] == plan.world_size
    assert got["global_batch"] == plan.global_batch
    # Go prints the shortest repr of its float64; sprig's float maths is decimal-based, so
    # allow a few ulps rather than demand bit equality.
    assert got["lr"] == pytest.approx(plan.lr, rel=1e-12, abs=0)
    assert got["max_iter"] == plan.max_iter
    if plan.spec.schedule.value == "step":
        assert got["steps"] == list(plan.steps)
        assert got["warmup_iters"] == plan.warmup_iters
    else:
        assert "steps" not in got


@pytest.mark.parametrize("case", MATRIX, ids=ids)
def test_notes_plan_equals_plan_module(render, case):
    rendered = render(values_from(**case))
    plan = plan_run({k: rendered.values[k] for k in SPEC_KEYS})
    assert_notes_match_plan(rendered.notes, plan)
    # The job itself agrees with the plan too.
    job = rendered.job
    assert job["spec"]["nprocPerNode"] == str(plan.procs_per_node)
    assert sum(r["replicas"] for r in rendered.replicas().values()) == plan.nodes


def test_sqrt_scaling_is_not_linear_scaling(render):
    # Guards the matrix: a wrong sqrt (e.g. falling back to linear) must show in NOTES.
    notes = render(values_from(gpus=64, scaling="sqrt")).notes
    assert notes_numbers(notes)["lr"] == pytest.approx(0.02 * 8**0.5, rel=1e-12)


@pytest.mark.parametrize("case", MATRIX[::9], ids=ids)
def test_notes_megdet_plan_command_prints_the_same_plan(render, capsys, case):
    notes = render(values_from(**case)).notes
    match = re.search(r"`megdet plan ([^`]*)`", notes)
    assert match, notes
    capsys.readouterr()
    assert megdet_main(["plan", *shlex.split(match.group(1)), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    got = notes_numbers(notes)
    for key in ("nodes", "procs_per_node", "world_size", "global_batch", "max_iter"):
        assert got[key] == summary[key], key
    assert got["lr"] == pytest.approx(summary["lr"], rel=1e-12, abs=0)


def test_notes_say_how_to_follow_the_run(render):
    notes = render({}).notes
    assert f"kubectl -n {NAMESPACE} get pytorchjob {RELEASE} -w" in notes
    assert f"kubectl -n {NAMESPACE} logs -f {RELEASE}-master-0 -c pytorch" in notes
    assert f"/output/{RELEASE}" in notes
    assert "NCCL_IB_DISABLE=1" in notes  # IB is off by default, and NOTES says so


@st.composite
def specs(draw: st.DrawFn) -> dict:
    per_node = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    gpus = draw(st.one_of(st.integers(1, per_node), st.integers(1, 64).map(lambda n: n * per_node)))
    max_iter = draw(st.integers(50, 200_000))
    first = draw(st.integers(1, max_iter - 2))
    return {
        "gpus": gpus,
        "gpusPerNode": per_node,
        "imagesPerGpu": draw(st.integers(1, 8)),
        "accumulationSteps": draw(st.integers(1, 8)),
        "referenceBatch": draw(st.sampled_from([1, 3, 7, 16, 24, 48, 100, 256])),
        "scaling": draw(st.sampled_from(["linear", "sqrt", "none"])),
        "baseLr": draw(st.sampled_from([0.02, 0.01, 0.1, 0.003, 1.5])),
        "maxIter": max_iter,
        "steps": [first, draw(st.integers(first + 1, max_iter - 1))],
        "warmupIters": draw(st.integers(0, max_iter - 1)),
    }


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=specs())
def test_chart_and_plan_module_agree_on_random_specs(render, case):
    # Either both accept the spec with the same numbers, or both reject it.
    try:
        plan = plan_run({k: case[k] for k in SPEC_KEYS if k in case})
    except SpecError:
        render.error(values_from(**case))
        return
    assert_notes_match_plan(render(values_from(**case)).notes, plan)
