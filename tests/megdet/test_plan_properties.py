"""Property tests: the plan keeps the images seen constant and rejects bad specs cleanly."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from megdet.plan import RunSpec, SpecError, parse_spec, plan_run

gpus_per_node = st.sampled_from([1, 2, 4, 8, 16])


@st.composite
def valid_specs(draw):
    per_node = draw(gpus_per_node)
    nodes = draw(st.integers(1, 64))
    gpus = per_node * nodes if nodes > 1 else draw(st.integers(1, per_node))
    return {
        "gpus": gpus,
        "gpus_per_node": per_node,
        "images_per_gpu": draw(st.integers(1, 8)),
        "accumulation_steps": draw(st.integers(1, 8)),
        "base_lr": draw(st.floats(1e-5, 1.0)),
        "reference_batch": draw(st.sampled_from([8, 16, 32, 64])),
        "scaling": draw(st.sampled_from(["linear", "sqrt", "none"])),
        "schedule": draw(st.sampled_from(["step", "three-stage"])),
    }


@settings(max_examples=300, deadline=None)
@given(valid_specs())
def test_images_seen_stay_within_one_global_batch_of_the_reference(data):
    try:
        plan = plan_run(data)
    except SpecError as err:
        # Only extreme scales may fail, and only because the schedule collapses.
        assert err.field in {"steps", "max_iter"}
        assert plan_scale(data) > 1000
        return
    assert abs(plan.images_seen - plan.reference_images_seen) <= plan.global_batch / 2
    assert plan.world_size == data["gpus"]
    assert plan.nodes == math.ceil(data["gpus"] / data["gpus_per_node"])
    assert plan.nodes * plan.procs_per_node == plan.world_size


def plan_scale(data):
    return (
        data["gpus"] * data["images_per_gpu"] * data["accumulation_steps"] / data["reference_batch"]
    )


@settings(max_examples=300, deadline=None)
@given(valid_specs(), st.floats(0, 1))
def test_lr_never_exceeds_the_scaled_peak_and_stays_positive(data, where):
    try:
        plan = plan_run(data)
    except SpecError:
        return
    lr = plan.lr_at(where * plan.max_iter)
    assert 0 < lr <= plan.lr * (1 + 1e-9)


anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(-10, 10**6), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
field_names = st.sampled_from([*RunSpec.model_fields, "gpu", "nodes", "lr"])


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(field_names, anything, max_size=6))
def test_any_input_is_planned_or_rejected_with_a_field_name_never_crashes(data):
    try:
        plan = plan_run(data)
    except SpecError as err:
        assert err.field in {*RunSpec.model_fields, "gpu", "nodes", "lr", "spec"}
        assert str(err).startswith(f"{err.field}: ")
        return
    assert plan.world_size >= 1


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 1000), st.sampled_from([2, 4, 8, 16]))
def test_partial_nodes_are_always_rejected_naming_gpus(gpus, per_node):
    if gpus <= per_node or gpus % per_node == 0:
        return
    try:
        parse_spec({"gpus": gpus, "gpus_per_node": per_node})
    except SpecError as err:
        assert err.field == "gpus"
        assert f"{gpus} is not a multiple of gpus_per_node {per_node}" in str(err)
    else:
        raise AssertionError("a partial node was accepted")
