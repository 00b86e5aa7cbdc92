"""The run values: every chart value (and MegDetRun spec field) that defines a run or reaches
the trainer, with the one name each goes by in the pod.

A run value has up to four names: the chart value and spec field (``bnGroupSize``), the
``RunSpec`` field when it is part of the plan (``bn_group_size``, ``megdet.plan``), and what the
pod gets: a detectron2 config key (``MEGDET.BN_GROUP_SIZE``), a ``megdet train`` flag
(``--train-json``) or an env variable of the launcher (``MEGDET_MAX_RESTARTS``). :data:`RUN_VALUES`
says, once per value, where it goes and whether it may change on a live run. The other tables are
made from it:

- ``megdet.overrides.OWNED_OVERRIDES`` (the keys ``extraOverrides`` may not set): every ``key``
  row;
- ``megdet.api.cel_rules.IMMUTABLE_FIELDS`` (the CRD's transition rules): every
  row with an ``immutable`` reason, on its top-level field;
- ``megdet.api.fields`` (the policy's classification): the ``recipe`` rows are the free
  "plan and its recipe" entry;
- docs/helm.md's "Where each run value goes" is :func:`markdown` (``make doc-tables``).

What the tests hold against it (``tests/megdet/test_run_values.py``,
``tests/chart/test_chart_run_values.py``): every row is a value of ``values.schema.json`` and a
field of the CRD's spec (``in_spec``), every key is one of the trainer's config
(``trainer/config.py``), and the run chart passes each ``key``/``flag``/``env`` row under its name,
written as :func:`pod_text` writes it (``charts/megdet/templates/_pod.tpl``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FORMS",
    "KINDS",
    "RUN_VALUES",
    "RunValue",
    "by_value",
    "immutable_fields",
    "markdown",
    "owned_keys",
    "pod_name",
    "pod_text",
    "recipe_leaves",
    "value_at",
]

#: Where a value goes: a detectron2 config key of ``megdet train``, a ``megdet train`` flag, an
#: env variable of the container (read by ``megdet launch``), the job object, a pod volume, or
#: the controller only.
KINDS = ("key", "flag", "env", "job", "volume", "controller")
#: How the chart writes a value into an argument or env value (see :func:`pod_text`).
FORMS = ("int", "float", "str", "bool", "tuple", "map")

PLAN = (
    "the plan (world size, global batch, learning rate, schedule) and the checkpoints already "
    "written were made for it, so a resumed run would be a different experiment"
)
MODEL = "the model and its checkpoints were built with it, so a resumed run would not match them"
DATA = "the run resumes on the data it started with; a different dataset is a different run"
OUTPUT = "the run's checkpoints live there; a new place would restart training from scratch"
TARGET = "the controller owns one job of one kind; create a new MegDetRun for the other"
ELASTIC = (
    "the bounds a live run may be resized within are part of the run's definition; "
    "create a new MegDetRun for others"
)


@dataclass(frozen=True)
class RunValue:
    """One run value.

    ``value``: the chart value and spec field, dotted (``elastic.resize``). ``kind`` and ``to``:
    where it goes (:data:`KINDS`; ``to`` is the key, flag or env name, or what of the job).
    ``form``: how the chart writes it (:data:`FORMS`). ``immutable``: why it may not change on a
    live run ("" when it may). ``recipe``: a number or enum of the run's recipe, free for any
    run (``megdet/api/fields.py`` classifies the others itself). ``optional``: the chart leaves
    it out when unset (null, "" or false). ``prefix``: what the chart puts before it (a folder).
    ``in_spec``: a MegDetRun spec field (False: the operator's to decide, ``DROPPED_VALUES``).
    """

    value: str
    kind: str
    to: str
    form: str
    immutable: str = ""
    recipe: bool = True
    optional: bool = False
    prefix: str = ""
    in_spec: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.value}: kind {self.kind!r}; allowed: {', '.join(KINDS)}")
        if self.form not in FORMS:
            raise ValueError(f"{self.value}: form {self.form!r}; allowed: {', '.join(FORMS)}")

    @property
    def top(self) -> str:
        """The top-level spec field (where a transition rule sits)."""
        return self.value.split(".", 1)[0]


_NOT_RECIPE = {"recipe": False}

#: Every run value, in the order of the chart's arguments where it passes them.
RUN_VALUES: tuple[RunValue, ...] = (
    RunValue("gpus", "job", "replicas x nprocPerNode (torchrun's world)", "int", PLAN),
    RunValue("gpusPerNode", "job", "nprocPerNode, the GPUs each pod requests", "int", PLAN),
    RunValue("imagesPerGpu", "key", "MEGDET.IMAGES_PER_GPU", "int", PLAN),
    RunValue("accumulationSteps", "key", "MEGDET.ACCUMULATION_STEPS", "int", PLAN),
    RunValue("baseLr", "key", "SOLVER.BASE_LR", "float", PLAN),
    RunValue("referenceBatch", "key", "MEGDET.REFERENCE_BATCH", "int", PLAN),
    RunValue("scaling", "key", "MEGDET.SCALING", "str", PLAN),
    RunValue("schedule", "key", "MEGDET.SCHEDULE", "str", PLAN),
    RunValue("maxIter", "key", "SOLVER.MAX_ITER", "int", PLAN),
    RunValue("steps", "key", "SOLVER.STEPS", "tuple", PLAN),
    RunValue("warmupIters", "key", "SOLVER.WARMUP_ITERS", "int", PLAN),
    RunValue("syncBN", "key", "MEGDET.SYNC_BN", "str", MODEL),
    RunValue("bnGroupSize", "key", "MEGDET.BN_GROUP_SIZE", "int", MODEL),
    RunValue("config", "flag", "--config", "str", MODEL, **_NOT_RECIPE),
    RunValue("extraOverrides", "key", "KEY VALUE pairs after the chart's own", "map", MODEL,
         **_NOT_RECIPE),
    RunValue("dataset.claimName", "volume", "/data (read-only)", "str", DATA, **_NOT_RECIPE),
    RunValue("dataset.trainJson", "flag", "--train-json", "str", DATA, prefix="/data/",
         **_NOT_RECIPE),
    RunValue("dataset.trainImages", "flag", "--train-images", "str", DATA, prefix="/data/",
         **_NOT_RECIPE),
    RunValue("dataset.valJson", "flag", "--val-json", "str", DATA, optional=True, prefix="/data/",
         **_NOT_RECIPE),
    RunValue("dataset.valImages", "flag", "--val-images", "str", DATA, optional=True,
         prefix="/data/", **_NOT_RECIPE),
    RunValue("output.claimName", "volume", "/output", "str", OUTPUT, **_NOT_RECIPE),
    RunValue("runName", "flag", "--output (the run's name when empty)", "str", OUTPUT,
             prefix="/output/", **_NOT_RECIPE),
    RunValue("target", "job", "the job's kind (PyTorchJob or TrainJob)", "str", TARGET,
         **_NOT_RECIPE),
    RunValue("elastic.minGpus", "controller", "the bounds of a resize", "int", ELASTIC),
    RunValue("elastic.maxGpus", "controller", "the bounds of a resize", "int", ELASTIC),
    RunValue("elastic.resize", "key", "MEGDET.RESIZE", "str", ELASTIC),
    RunValue("metrics.port", "key", "MEGDET.METRICS.PORT (0 without metrics.enabled)", "int",
         **_NOT_RECIPE),
    RunValue("resumeFrom", "key", "MEGDET.RESUME_FROM", "str", optional=True, **_NOT_RECIPE),
    RunValue("allowUnsafeWeights", "key", "MEGDET.ALLOW_UNSAFE_WEIGHTS", "bool", optional=True,
         in_spec=False, **_NOT_RECIPE),
    RunValue("numWorkers", "key", "DATALOADER.NUM_WORKERS", "int", optional=True),
    RunValue("workerRestarts", "env", "MEGDET_MAX_RESTARTS", "int"),
    RunValue("terminationGracePeriodSeconds", "env", "MEGDET_GRACE_PERIOD_SECONDS", "int"),
    RunValue("restartPolicy", "job", "each replica's restartPolicy", "str"),
)  # fmt: skip


def by_value(table: tuple[RunValue, ...] = RUN_VALUES) -> dict[str, RunValue]:
    """Each row by its value; a value listed twice raises ValueError."""
    out: dict[str, RunValue] = {}
    for row in table:
        if row.value in out:
            raise ValueError(f"{row.value}: listed twice")
        out[row.value] = row
    return out


def pod_name(row: RunValue) -> str:
    """The key, flag or env name of a row (its ``to`` without the note after it)."""
    return row.to.split(" ", 1)[0]


def owned_keys(table: tuple[RunValue, ...] = RUN_VALUES) -> dict[str, str]:
    """detectron2 key -> the value that owns it, for every row the chart passes as one key."""
    return {pod_name(r): r.value for r in table if r.kind == "key" and r.form != "map"}


def immutable_fields(table: tuple[RunValue, ...] = RUN_VALUES) -> dict[str, str]:
    """Top-level spec field -> why it may not change on a live run; rows of one top-level
    field must give one reason."""
    out: dict[str, str] = {}
    for row in table:
        if not row.immutable:
            continue
        if out.setdefault(row.top, row.immutable) != row.immutable:
            raise ValueError(f"{row.value}: {row.top} is immutable for two reasons")
    return out


def recipe_leaves(table: tuple[RunValue, ...] = RUN_VALUES) -> tuple[str, ...]:
    """The recipe rows as leaves of the CRD's spec (``spec.steps[]`` for a list)."""
    return tuple(f"spec.{r.value}{'[]' if r.form == 'tuple' else ''}" for r in table if r.recipe)


def pod_text(row: RunValue, value: Any) -> str | None:
    """The argument or env value the run chart writes for ``value`` (None: left out)."""
    if row.optional and (value is None or value == "" or value is False):
        return None
    if row.form == "int":
        return str(int(value))
    if row.form == "float":
        return repr(float(value))
    if row.form == "bool":
        return "True" if value else "False"
    if row.form == "tuple":
        items = [str(int(v)) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    return row.prefix + str(value)


def value_at(values: Mapping[str, Any], value: str) -> Any:
    """A dotted value of a values mapping (None where it has none)."""
    node: Any = values
    for part in value.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def markdown(defaults: Mapping[str, Any], table: tuple[RunValue, ...] = RUN_VALUES) -> str:
    """docs/helm.md's table "Where each run value goes", with the chart's ``defaults``."""
    lines = [
        "| value | default | reaches | as | fixed at creation |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in table:
        default = json.dumps(value_at(defaults, row.value))
        name = f"`{row.value}`" + ("" if row.in_spec else " (operator only)")
        to = row.to
        if row.kind in ("key", "flag", "env") and row.form != "map":
            name_, _, note = row.to.partition(" ")
            shown = f"{name_} {row.prefix}<value>" if row.prefix else name_
            to = f"`{shown}`" + (f" {note}" if note else "")
        fixed = "yes" if row.immutable else "no"
        lines.append(f"| {name} | `{default}` | {row.kind} | {to} | {fixed} |")
    return "\n".join(lines) + "\n"
