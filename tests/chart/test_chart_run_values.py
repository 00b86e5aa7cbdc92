"""The run chart passes each run value of megdet/run_values.py under the table's name, written
as the table writes it, and passes nothing of its own that the table does not list.

The table is the one list of what a run value becomes in the pod (a detectron2 key, a
``megdet train`` flag, a launcher env variable); ``charts/megdet/templates/_pod.tpl`` is the
copy this module holds against it, for every CI values file (both targets) and for values that
set every optional one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from chart_helpers import (
    ALL_CI_VALUES,
    CHART_DIR,
    env_of,
    flags_of,
    merge_values,
    overrides_of,
    values_file,
)

from megdet.run_values import RUN_VALUES, RunValue, pod_name, pod_text, value_at

DEFAULTS = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
#: Every optional value set (resumeFrom, allowUnsafeWeights, numWorkers, the validation set).
ALL_SET = {
    "gpus": 4,
    "gpusPerNode": 2,
    "resumeFrom": "earlier-run",
    "allowUnsafeWeights": True,
    "numWorkers": 0,
    "steps": [700],
    "maxIter": 1000,
    "warmupIters": 10,
    "baseLr": 1,
    "dataset": {"valJson": "v.json", "valImages": "v"},
    "metrics": {"enabled": True, "port": 9555},
    "workerRestarts": 2,
    "terminationGracePeriodSeconds": 77,
    "extraOverrides": {"SOLVER.GAMMA": "0.5"},
}
CASES = {p.name: values_file(p) for p in ALL_CI_VALUES} | {"every optional value": ALL_SET}


def trainer_containers(objects: list) -> list[dict]:
    """Every container that runs the trainer, in any object (PyTorchJob, TrainJob's runtime)."""
    found: list[dict] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            if "image" in node and (node.get("args") or [None])[0] == "train":
                found.append(dict(node))
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(objects)
    return found


def expected_pod(values: Mapping[str, Any], table: tuple[RunValue, ...] = RUN_VALUES) -> dict:
    """What the table says the container gets for ``values`` (merged over the defaults):
    {"key": {KEY: text}, "flag": {FLAG: text}, "env": {NAME: text}}."""
    merged = merge_values(DEFAULTS, values)
    out: dict[str, dict[str, str]] = {"key": {}, "flag": {}, "env": {}}
    for row in table:
        if row.kind not in out or row.form == "map":
            continue
        value = value_at(merged, row.value)
        if row.value == "runName" and not value:
            value = merged.get("fullnameOverride") or "megdet"  # the release's fullname
        if row.value == "metrics.port" and not merged["metrics"]["enabled"]:
            value = 0  # the trainer's "metrics off"
        text = pod_text(row, value)
        if text is not None:
            out[row.kind][pod_name(row)] = text
    return out


def problems(container: Mapping[str, Any], values: Mapping[str, Any], table=RUN_VALUES) -> list:
    """Where the rendered container and the table disagree (empty: they agree)."""
    args = container["args"]
    expected = expected_pod(values, table)
    extra = merge_values(DEFAULTS, values).get("extraOverrides") or {}
    keys = {k: v for k, v in overrides_of(args).items() if k not in extra}
    flags = flags_of(args)
    env = {k: v for k, v in env_of(container).items() if k.startswith("MEGDET_")}
    env.pop("MEGDET_RUN_ID", None)  # the release's name, not a value
    found = []
    for kind, got in (("key", keys), ("flag", flags), ("env", env)):
        for name in sorted(set(got) | set(expected[kind])):
            if got.get(name) != expected[kind].get(name):
                found.append(f"{kind} {name}: chart {got.get(name)!r}, table "
                             f"{expected[kind].get(name)!r}")  # fmt: skip
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_chart_passes_every_run_value_as_the_table_says(render, case):
    values = CASES[case]
    containers = trainer_containers(render(values).objects)
    assert containers
    for container in containers:
        assert problems(container, values) == []


def test_the_check_notices_a_row_the_chart_does_not_pass_or_a_key_the_table_lacks(render):
    (container, *_) = trainer_containers(render(ALL_SET).objects)
    renamed = tuple(
        RunValue(r.value, r.kind, "MEGDET.BN_GROUPS", r.form, r.immutable)
        if r.value == "bnGroupSize"
        else r
        for r in RUN_VALUES
    )
    found = problems(container, ALL_SET, renamed)
    assert "key MEGDET.BN_GROUPS: chart None, table '0'" in found
    assert "key MEGDET.BN_GROUP_SIZE: chart '0', table None" in found
    without_env = tuple(r for r in RUN_VALUES if r.value != "workerRestarts")
    assert problems(container, ALL_SET, without_env) == [
        "env MEGDET_MAX_RESTARTS: chart '2', table None"
    ]
    as_int = tuple(
        RunValue(r.value, r.kind, r.to, "int", r.immutable) if r.value == "baseLr" else r
        for r in RUN_VALUES
    )
    assert problems(container, ALL_SET, as_int) == ["key SOLVER.BASE_LR: chart '1.0', table '1'"]
