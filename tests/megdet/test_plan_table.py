"""Table tests for the plan: the numbers users and the other components rely on."""

import math

import pytest

from megdet.plan import RunSpec, Scaling, Schedule, SpecError, parse_spec, plan_run


def test_sixteen_gpus_is_two_nodes_with_doubled_lr_and_halved_schedule():
    plan = plan_run(RunSpec(gpus=16))
    assert (plan.world_size, plan.nodes, plan.procs_per_node) == (16, 2, 8)
    assert plan.global_batch == 32
    assert plan.lr == pytest.approx(0.04)
    assert plan.max_iter == 45000
    assert plan.steps == (30000, 40000)
    assert plan.warmup_iters == 500


def test_megdet_setting_128_gpus_batch_256_lr_032():
    plan = plan_run({"gpus": 128})
    assert plan.nodes == 16
    assert plan.global_batch == 256
    assert plan.lr == pytest.approx(0.32)
    assert plan.max_iter == 5625
    assert plan.steps == (3750, 5000)


def test_rounding_is_half_up():
    # 1000 / 16 = 62.5 -> 63; detectron2 uses round(); we document half-up explicitly.
    plan = plan_run({"gpus": 128})
    assert plan.warmup_iters == 63


@pytest.mark.parametrize(
    ("gpus", "gpus_per_node", "nodes", "procs"),
    [(1, 8, 1, 1), (2, 8, 1, 2), (8, 8, 1, 8), (4, 4, 1, 4), (8, 4, 2, 4), (64, 8, 8, 8)],
)
def test_nodes_and_processes_per_node(gpus, gpus_per_node, nodes, procs):
    plan = plan_run({"gpus": gpus, "gpus_per_node": gpus_per_node})
    assert (plan.nodes, plan.procs_per_node, plan.world_size) == (nodes, procs, gpus)


def test_single_node_keeps_reference_recipe_at_eight_gpus():
    plan = plan_run({"gpus": 8})
    assert plan.global_batch == 16
    assert plan.scale == 1
    assert (plan.lr, plan.max_iter, plan.steps, plan.warmup_iters) == (
        0.02,
        90000,
        (60000, 80000),
        1000,
    )


def test_accumulation_multiplies_global_batch_like_more_gpus():
    acc = plan_run({"gpus": 8, "accumulation_steps": 4})
    wide = plan_run({"gpus": 32})
    assert acc.global_batch == wide.global_batch == 64
    assert acc.lr == pytest.approx(wide.lr) == pytest.approx(0.08)
    assert acc.max_iter == wide.max_iter == 22500
    assert acc.nodes == 1 and wide.nodes == 4


def test_sqrt_scaling():
    plan = plan_run({"gpus": 64, "scaling": "sqrt"})
    assert plan.global_batch == 128
    assert plan.lr == pytest.approx(0.02 * math.sqrt(8))
    assert plan.max_iter == 11250  # the schedule scales with the batch whatever the LR rule


def test_no_scaling_keeps_base_lr():
    plan = plan_run({"gpus": 64, "scaling": Scaling.NONE})
    assert plan.lr == 0.02
    assert plan.max_iter == 11250


def test_camel_case_fields_are_accepted_for_yaml_and_crs():
    plan = plan_run({"gpus": 16, "gpusPerNode": 4, "imagesPerGpu": 4, "baseLr": 0.01})
    assert (plan.nodes, plan.global_batch) == (4, 64)
    assert plan.lr == pytest.approx(0.04)


def test_step_schedule_warmup_then_steps():
    plan = plan_run({"gpus": 16})
    assert plan.lr_at(0) == pytest.approx(0.04 * 0.001)
    assert plan.lr_at(250) == pytest.approx(0.04 * (0.001 * 0.5 + 0.5))
    assert plan.lr_at(500) == pytest.approx(0.04)
    assert plan.lr_at(29999) == pytest.approx(0.04)
    assert plan.lr_at(30000) == pytest.approx(0.004)
    assert plan.lr_at(40000) == pytest.approx(0.0004)
    assert plan.lr_at(45000) == pytest.approx(0.0004)


def test_three_stage_schedule_shape():
    plan = plan_run({"gpus": 128, "schedule": "three-stage"})
    t1, t2 = plan.stage_boundaries()
    assert (t1, t2) == (1688, 3938)  # 30% and 70% of 5625, half up
    peak, plateau = 0.32, 0.02 * math.sqrt(16)
    assert plan.lr_at(t1) == pytest.approx(peak)
    assert plan.lr_at(t2) == pytest.approx(plateau)
    assert plan.lr_at(plan.max_iter) == pytest.approx(0.1 * plateau)
    assert plan.summary()["stage_boundaries"] == [t1, t2]


@pytest.mark.parametrize("gpus", [16, 128, 1024])
def test_three_stage_schedule_is_continuous_at_stage_boundaries(gpus):
    plan = plan_run({"gpus": gpus, "schedule": Schedule.THREE_STAGE})
    for boundary in plan.stage_boundaries():
        left, right = plan.lr_at(boundary - 1e-6), plan.lr_at(boundary + 1e-6)
        assert right == pytest.approx(left, rel=1e-3)


@pytest.mark.parametrize(
    ("spec", "field", "fragment"),
    [
        ({"gpus": 12}, "gpus", "12 is not a multiple of gpus_per_node 8 (multi-node runs use"),
        ({"gpus": 0}, "gpus", "greater than or equal to 1"),
        ({"gpus": -3}, "gpus", "greater than or equal to 1"),
        ({"gpus": True}, "gpus", "got a boolean"),
        ({"gpus": "x"}, "gpus", "valid integer"),
        ({"gpus": 8, "scaling": "cubic"}, "scaling", "'linear', 'sqrt' or 'none'"),
        ({"gpus": 8, "schedule": "cosine"}, "schedule", "'step' or 'three-stage'"),
        ({"gpus": 8, "base_lr": 0}, "base_lr", "greater than 0"),
        ({"gpus": 8, "base_lr": float("nan")}, "base_lr", "finite"),
        ({"gpus": 8, "steps": [80000, 60000]}, "steps", "strictly increasing"),
        ({"gpus": 8, "steps": [95000]}, "steps", "below max_iter 90000"),
        ({"gpus": 8, "warmup_iters": 90000}, "warmup_iters", "below max_iter"),
        ({"gpus": 8, "gpu": 8}, "gpu", "unknown field; allowed fields: accumulation_steps"),
        ({}, "gpus", "is required"),
        (
            {"gpus": 64, "max_iter": 100, "steps": [60, 64], "warmup_iters": 0},
            "steps",
            "collapse to [8, 8]",
        ),
        (
            {"gpus": 1024, "max_iter": 10, "steps": [], "warmup_iters": 0},
            "max_iter",
            "less than one iteration",
        ),
    ],
)
def test_bad_specs_name_the_field_and_the_rule(spec, field, fragment):
    with pytest.raises(SpecError) as info:
        plan_run(spec)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert fragment in str(info.value)


def test_parse_spec_rejects_non_mappings():
    with pytest.raises(SpecError, match="expected a mapping"):
        parse_spec([8])  # type: ignore[arg-type]


def test_plan_summary_has_the_documented_keys():
    keys = set(plan_run({"gpus": 16}).summary())
    assert {
        "world_size",
        "nodes",
        "gpus_per_node",
        "global_batch",
        "lr",
        "max_iter",
        "steps",
        "warmup_iters",
    } <= keys


def test_scale_iters_for_periods():
    plan = plan_run({"gpus": 64})  # k = 8
    assert plan.scale_iters(5000) == 625
    assert plan.scale_iters(1) == 1  # never zero
