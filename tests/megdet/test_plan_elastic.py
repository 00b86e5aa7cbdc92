"""Property tests of a run that changes size: the schedule stays where it is in images.

A run is simulated segment by segment: each segment is planned by ``plan_continuation`` from
the images the run has seen, trains a random number of its iterations and stops (a resize, a
preemption); the last one trains to its end. Whatever the sequence of world sizes (1 to 1024
GPUs) and modes, the run sees the planned total within half a global batch, every LR
milestone is applied once, within half a global batch of its image count (the batch of the
segment it fell due in), and never taken back; with the batch kept, the learning rate at
every image count is the fixed run's.
"""

from __future__ import annotations

from bisect import bisect_right

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from megdet.plan import Resize, SpecError, plan_continuation, plan_run

PER_NODE = 8
world_sizes = st.sampled_from([1, 2, 3, 4, 6, 8, 16, 24, 32, 64, 128, 256, 512, 1024])


@st.composite
def recipes(draw):
    return {
        "gpus_per_node": PER_NODE,
        "images_per_gpu": draw(st.integers(1, 4)),
        "accumulation_steps": draw(st.integers(1, 4)),
        "base_lr": 0.02,
        "reference_batch": 16,
        "max_iter": 90000,
        "steps": (60000, 80000),
        "warmup_iters": draw(st.sampled_from([0, 500, 1000])),
        "scaling": draw(st.sampled_from(["linear", "sqrt", "none"])),
        "schedule": draw(st.sampled_from(["step", "three-stage"])),
    }


def _simulate(recipe, worlds, stops, mode):
    """Train segment by segment; returns the segments' plans, the iterations each ran
    (``range(start, end)``) and the images seen at the end."""
    images, run_batch, plans, ranges = 0, None, [], []
    for n, (gpus, stop) in enumerate(zip(worlds, stops, strict=True)):
        plan = plan_continuation({**recipe, "gpus": gpus}, images, run_batch=run_batch, resize=mode)
        assert plan.images_at(plan.start_iter) == images  # it starts where the run stopped
        run_batch = run_batch or plan.global_batch
        left = plan.max_iter - plan.start_iter
        end = plan.max_iter if n == len(worlds) - 1 else plan.start_iter + int(stop * left)
        images = plan.images_at(end)
        plans.append(plan)
        ranges.append(range(plan.start_iter, end))
    return plans, ranges, images


def _milestones_applied(plan, iterations):
    """(first iteration, milestones applied) where the count of applied milestones changes,
    plus the count at the segment's first iteration."""
    if not iterations:
        return []
    points = [iterations[0]] + [s for s in plan.steps if iterations[0] < s < iterations.stop]
    return [(i, bisect_right(plan.steps, i)) for i in points]


@settings(max_examples=150, deadline=None)
@given(
    recipes(),
    st.lists(world_sizes, min_size=1, max_size=5),
    st.lists(st.floats(0, 0.6), min_size=5, max_size=5),
    st.sampled_from(list(Resize)),
)
# A batch kept at 4 cannot be kept on 512 GPUs (2048 there): that stretch stops at the iteration
# it rounded the 240,000-step milestone to (960,348 images), and the next applies it at once.
@example(
    {**dict(gpus_per_node=PER_NODE, images_per_gpu=1, accumulation_steps=4, base_lr=0.02),
     **dict(reference_batch=16, max_iter=90000, steps=(60000, 80000), warmup_iters=0),
     **dict(scaling="linear", schedule="step")},
    [1, 1, 512, 1], [0.359375, 0.044921875, 0.45703125, 0.0, 0.0], Resize.KEEP_BATCH,
)  # fmt: skip
def test_any_sequence_of_resizes_sees_the_planned_images_and_milestones(
    recipe, worlds, stops, mode
):
    worlds = [w if w <= PER_NODE else w - w % PER_NODE for w in worlds]
    try:
        plans, ranges, images = _simulate(recipe, worlds, stops[: len(worlds)], mode)
    except SpecError as err:
        # Only a batch so large that the schedule collapses is refused (as plan_run refuses it).
        assert err.field in {"steps", "max_iter"}, err
        assume(False)
    total = plans[0].reference_images_seen
    assert abs(images - total) <= plans[-1].global_batch / 2
    # Milestones: applied in order, once, never taken back, within half a batch of their images.
    # One applied at a segment's first iteration fell due where the segment before stopped: the
    # iteration that segment rounded it to was its end, so its batch bounds it too.
    if recipe["schedule"] == "step":
        applied, before = 0, 0
        for plan, iterations in zip(plans, ranges, strict=True):
            for i, count in _milestones_applied(plan, iterations):
                assert count >= applied
                g = max(plan.global_batch, before) if i == plan.start_iter else plan.global_batch
                for m in range(applied, count):
                    milestone = recipe["steps"][m] * recipe["reference_batch"]
                    assert abs(plan.images_at(i) - milestone) <= g / 2, (i, milestone, g)
                applied = count
            before = plan.global_batch if iterations else max(before, plan.global_batch)
        assert applied == len(recipe["steps"])


@settings(max_examples=100, deadline=None)
@given(recipes(), st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=2, max_size=4), st.data())
def test_keeping_the_batch_keeps_the_fixed_runs_learning_rate_at_every_image(recipe, worlds, data):
    recipe = {**recipe, "images_per_gpu": 2, "accumulation_steps": 1}
    first = worlds[0]
    # The kept batch must be makeable by every world: the first world is the largest.
    worlds = [first * 16] + [w for w in worlds if (first * 16) % w == 0]
    stops = data.draw(st.lists(st.floats(0, 0.6), min_size=len(worlds), max_size=len(worlds)))
    fixed = plan_run({**recipe, "gpus": worlds[0]})
    plans, ranges, images = _simulate(recipe, worlds, stops, Resize.KEEP_BATCH)
    assert images == fixed.images_seen
    for plan, iterations in zip(plans, ranges, strict=True):
        assert (plan.global_batch, plan.lr, plan.max_iter, plan.steps) == (
            fixed.global_batch, fixed.lr, fixed.max_iter, fixed.steps
        )  # fmt: skip
        for i in iterations[:: max(1, len(iterations) // 50)]:
            assert plan.lr_at(i) == fixed.lr_at(plan.images_at(i) // fixed.global_batch)


@settings(max_examples=200, deadline=None)
@given(recipes(), world_sizes)
def test_a_run_that_does_not_change_size_is_todays_plan_exactly(recipe, gpus):
    gpus = gpus if gpus <= PER_NODE else gpus - gpus % PER_NODE
    spec = {**recipe, "gpus": gpus}
    try:
        fixed = plan_run(spec)
    except SpecError:
        return
    assert plan_continuation(spec, 0) == fixed
    kept = plan_continuation(spec, 0, run_batch=fixed.global_batch)
    assert kept.model_copy(update={"resize": None, "resize_reason": ""}) == fixed


def test_the_batch_is_rescaled_when_the_new_world_cannot_make_it_and_the_reason_says_so():
    recipe = {
        "gpus": 3,
        "images_per_gpu": 2,
        "max_iter": 900,
        "steps": (600, 800),
        "warmup_iters": 10,
    }
    plan = plan_continuation(recipe, 1600, run_batch=16)
    assert plan.resize is Resize.RESCALE
    assert plan.global_batch == 6 and plan.lr == pytest.approx(0.02 * 6 / 16)
    assert (
        "3 GPUs x 2 images per GPU = 6 does not divide the run's global batch 16"
        in plan.resize_reason
    )
    kept = plan_continuation({**recipe, "gpus": 4}, 1600, run_batch=16)
    assert kept.resize is Resize.KEEP_BATCH and kept.spec.accumulation_steps == 2
    assert (kept.start_iter, kept.global_batch, kept.lr) == (100, 16, 0.02)


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"images_done": -1}, "images_done", "must be >= 0"),
        ({"images_done": True}, "images_done", "expected a whole number"),
        ({"images_done": 1.5}, "images_done", "expected a whole number"),
        ({"images_done": 10, "run_batch": 0}, "run_batch", "must be >= 1"),
        ({"images_done": 10, "resize": "grow"}, "resize", "allowed values: keep-batch, rescale"),
    ],
)
def test_bad_continuation_input_names_the_field(kwargs, field, words):
    images = kwargs.pop("images_done")
    with pytest.raises(SpecError) as err:
        plan_continuation({"gpus": 8}, images, **kwargs)
    assert err.value.field == field and words in str(err.value)
