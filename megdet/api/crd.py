"""The MegDetRun CRD, generated from the run chart's ``values.schema.json`` and ``values.yaml``.

A MegDetRun's spec uses the run chart's value names, so its schema is the chart's values schema
translated to a Kubernetes structural schema (:mod:`megdet.api.openapi`), with
defaults from ``values.yaml`` (so a sparse CR and ``helm install`` mean the same run), less the
values that are not the run author's (:data:`~megdet.controller.api.DROPPED_VALUES`). Its CEL
rules are the values schema's own ``x-kubernetes-validations`` (written next to the field they
guard, their messages from :mod:`megdet.messages`) plus those
:mod:`megdet.api.cel_rules` generates; this module adds the status schema, the
printer columns and the CRD around them.

``make crd`` (``python -m megdet.api.crd``) writes :data:`CRD_FILE`; a test fails
when the committed copy is stale. Generation fails, listing them, if any field lacks a
description.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from megdet.api.cel_rules import (
    overrides_map,
    pod_metadata_rules,
    resolve_rules,
    root_rules,
    steps_rules,
    transition_rules,
)
from megdet.api.openapi import convert, missing_descriptions
from megdet.controller import run_summary as summary
from megdet.controller.api import DROPPED_VALUES, GROUP, KIND, PLURAL, SINGULAR, VERSION
from megdet.controller.job_state import PHASES, TERMINAL_PHASES
from megdet.controller.lifecycle import STAGES as LIFECYCLE_STAGES
from megdet.controller.lifecycle import STARTUP_PARTS
from megdet.controller.render import chart_dir
from megdet.progress import STAGES

__all__ = [
    "CRD_FILE",
    "MissingDescriptionsError",
    "build_crd",
    "committed_spec_schema",
    "crd_yaml",
    "spec_schema",
]

SHORT_NAMES = ["mdr"]
#: Where `make crd` writes the CRD (the operator chart installs it from crds/).
CRD_FILE = (
    Path(__file__).resolve().parents[2] / "charts/megdet-operator/crds/megdetruns.megdet.io.yaml"
)


class MissingDescriptionsError(ValueError):
    """Fields of the values schema without a description (kubectl explain would be empty)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        super().__init__(
            "every field needs a description in charts/megdet/values.schema.json; missing: "
            + ", ".join(paths)
        )


def _load_chart(chart: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    schema = json.loads((chart / "values.schema.json").read_text())
    defaults = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    return schema, defaults


def spec_schema(chart: Path | None = None) -> dict[str, Any]:
    """The MegDetRun spec schema (structural OpenAPI v3) for the run chart at ``chart``."""
    values_schema, defaults = _load_chart(chart or chart_dir())
    missing = missing_descriptions(values_schema, "spec", drop=DROPPED_VALUES)
    if missing:
        raise MissingDescriptionsError(missing)
    spec = convert(values_schema, defaults, "spec", drop=DROPPED_VALUES, pattern_map=overrides_map)
    spec.pop("default", None)
    rules = spec.pop("x-kubernetes-validations", [])
    spec["description"] = (
        "The run: the run chart's values (charts/megdet/values.yaml), minus nameOverride and "
        "fullnameOverride (the job is named after the MegDetRun)."
    )
    spec["x-kubernetes-validations"] = rules
    resolve_rules(spec, spec)
    steps_rules(spec["properties"])
    pod_metadata_rules(spec["properties"], chart or chart_dir())
    transition_rules(spec)
    return spec


def _field(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


def status_schema() -> dict[str, Any]:
    """The status the controller writes (plan, phase, conditions, job)."""
    phases = list(PHASES)
    condition = _field(
        "object",
        "One aspect of the run's state (Kubernetes condition conventions).",
        required=["type", "status"],
        properties={
            "type": _field("string", "Condition type, e.g. Valid, JobCreated, Running, Succeeded."),
            "status": _field(
                "string", "True, False or Unknown.", enum=["True", "False", "Unknown"]
            ),
            "reason": _field("string", "Machine-readable CamelCase reason for the last change."),
            "message": _field("string", "Human-readable details; names the field for Invalid."),
            "lastTransitionTime": _field("string", "When status last changed.", format="date-time"),
            "observedGeneration": _field(
                "integer", "metadata.generation this condition was computed from.", format="int64"
            ),
        },
    )
    time = {"format": "date-time"}
    return _field(
        "object",
        "What the controller observed and planned. Written only by the controller.",
        properties={
            "phase": _field("string", "The run's phase, mirrored from its job.", enum=phases),
            "conditions": _field(
                "array",
                "Conditions of the run, one per type.",
                items=condition,
                **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
            ),
            "observedGeneration": _field(
                "integer", "metadata.generation the status was computed from.", format="int64"
            ),
            "worldSize": _field("integer", "Planned world size (training processes)."),
            "nodes": _field("integer", "Planned nodes (pods)."),
            "globalBatch": _field("integer", "Images per optimizer step across the run."),
            "lr": _field("number", "Planned peak learning rate for the global batch."),
            "maxIter": _field("integer", "Planned iterations at the global batch."),
            "steps": _field("array", "Planned LR decay iterations.", items={"type": "integer"}),
            "warmupIters": _field("integer", "Planned warmup iterations."),
            "jobName": _field("string", "Name of the job the controller created."),
            "jobUID": _field(
                "string",
                "metadata.uid of the job the controller created: the only job it mirrors "
                "(another object later created under jobName is not the run's).",
            ),
            "target": _field("string", "Kind of job: pytorchjob or trainjob."),
            "gpus": _field(
                "integer",
                "GPUs of the job the controller created last: the run's size now (spec.gpus "
                "of an elastic run differs while a resize is under way).",
            ),
            "attempt": _field(
                "integer",
                "Jobs the controller has created for the run: 1 for the first, one more per "
                "resize. Never goes down; a job's checkpoints belong to the attempt that wrote "
                "them.",
            ),
            "segments": _field(
                "array",
                "One per job the run had (the first and the newest kept): the size it ran at.",
                items=_field(
                    "object",
                    "A job of the run.",
                    properties={
                        "attempt": _field("integer", "The attempt this job was."),
                        "gpus": _field("integer", "GPUs of the job."),
                        "globalBatch": _field(
                            "integer",
                            "Global batch of the job as planned (a resized keep-batch run keeps "
                            "the first job's).",
                        ),
                        "jobUID": _field("string", "metadata.uid of the job."),
                        "startTime": _field(
                            "string", "When the controller created the job.", **time
                        ),
                        "reason": _field("string", "Created (the first job) or Resized."),
                    },
                ),
            ),
            "resize": _field(
                "object",
                "A resize under way: the job being stopped (with a checkpoint) and the sizes. "
                "Gone once the job at the new size exists.",
                properties={
                    "fromGpus": _field("integer", "GPUs of the job being stopped."),
                    "toGpus": _field("integer", "GPUs spec.gpus asked for."),
                    "jobUID": _field("string", "metadata.uid of the job being stopped."),
                    "requestTime": _field("string", "When the resize started.", **time),
                },
            ),
            "startTime": _field("string", "When the job started running.", **time),
            "completionTime": _field("string", "When the job succeeded or failed.", **time),
            "restarts": _field("integer", "Times the job restarted its pods."),
            "stage": _field(
                "string",
                "The step the run is at, from its phase and lifecycle conditions (Queued: "
                "Kueue has not admitted it; Scheduling; Initializing: containers starting, the "
                "world forming, model and data loading; Training; Evaluating).",
                enum=list(LIFECYCLE_STAGES),
            ),
            "startup": _field(
                "object",
                "Seconds each part of the newest attempt's start took, where the pods' and the "
                "trainer's own times give both ends.",
                properties={
                    "attempt": _field("integer", "The attempt (status.attempt) measured."),
                    **{
                        name: _field("integer", f"Seconds: {what}.")
                        for name, what in STARTUP_PARTS.items()
                    },
                },
            ),
            "progress": progress_schema(),
            "summary": summary_schema(),
            "handledConfiguration": _field(
                "string",
                "The spec, labels and annotations the controller last reconciled to an end, as "
                "JSON: what the next change is compared with (kopf's diff base). Bookkeeping, "
                "not for users.",
            ),
        },
    )


def progress_schema() -> dict[str, Any]:
    """``status.progress``: what the trainer last reported (``megdet.progress.to_status``)."""
    time = {"format": "date-time"}
    return _field(
        "object",
        "Training progress the trainer reported: to the controller's endpoint (target "
        "pytorchjob) or to Kubeflow Trainer (target trainjob, mirrored from the TrainJob's "
        "status.trainerStatus). Written at most once per run every --progress-interval "
        "seconds (pytorchjob), or when Trainer stores a report, which the trainer sends at most "
        "every MEGDET_PROGRESS_INTERVAL seconds besides evaluations and checkpoints (trainjob).",
        properties={
            "iteration": _field("integer", "Iterations done.", format="int64"),
            "maxIter": _field("integer", "Iterations planned (SOLVER.MAX_ITER).", format="int64"),
            "percent": _field("integer", "Percent of maxIter done, 0-100.", minimum=0, maximum=100),
            "imagesSeen": _field("integer", "Training images seen so far.", format="int64"),
            "plannedImages": _field("integer", "Training images planned.", format="int64"),
            "imagesPerSecond": _field("number", "Training throughput, images per second."),
            "etaSeconds": _field("integer", "Estimated seconds until maxIter.", format="int64"),
            "etaTime": _field("string", "Estimated end: updatedTime + etaSeconds.", **time),
            "ap": _field("number", "COCO box AP of the last evaluation, in percent."),
            "ap50": _field("number", "COCO box AP50 of the last evaluation, in percent."),
            "evalIteration": _field("integer", "Iteration of the last evaluation.", format="int64"),
            "checkpointIteration": _field(
                "integer", "Iteration of the last complete checkpoint.", format="int64"
            ),
            "checkpointTime": _field("string", "When the last checkpoint was written.", **time),
            "updatedTime": _field("string", "When the trainer measured this progress.", **time),
            "stage": _field(
                "string",
                "Where the trainer's attempt is: loading (the world formed; building the model "
                "and data), firstIteration (model and data ready), training, evaluating, "
                "finished.",
                enum=list(STAGES),
            ),
            "stageTime": _field("string", "When the trainer entered that stage.", **time),
            "worldTime": _field(
                "string", "When this attempt's world formed (its rendezvous done).", **time
            ),
            "loadedTime": _field(
                "string", "When this attempt's model, data and checkpoint were ready.", **time
            ),
            "firstIterationTime": _field(
                "string", "When this attempt's first iteration was done.", **time
            ),
            # The final report's run totals (trainer/report.py, from rank 0's log).
            "attempts": _field("integer", "The trainer's attempts in its log (final report)."),
            "wallSeconds": _field("integer", "Seconds of the attempts, summed (final report)."),
            "setupSeconds": _field(
                "integer", "Of them, start to the training loop, summed (final report)."
            ),
            "stepsSeconds": _field(
                "integer", "Of them, the timed training steps, summed (final report)."
            ),
            "hooksSeconds": _field(
                "integer", "Of them, hooks: checkpoints, evaluations, writers (final report)."
            ),
            "evaluationSeconds": _field(
                "integer", "Of them, evaluation inference, summed (final report)."
            ),
            "stepsImagesPerSecond": _field(
                "number", "Images per second over the timed steps of all attempts (final report)."
            ),
        },
    )


def summary_schema() -> dict[str, Any]:
    """``status.summary``: a finished run's summary (``controller/run_summary.py``)."""
    wide = {"iteration", "maxIter", "evalIteration", "imagesSeen", "plannedImages"}
    properties: dict[str, Any] = {}
    for name, what in summary.FIELDS.items():
        if name == "phase":
            properties[name] = _field("string", what, enum=sorted(TERMINAL_PHASES))
        elif name in summary.TEXT_FIELDS:
            properties[name] = _field("string", what, maxLength=summary.MAX_TEXT)
        elif name in summary.TIME_FIELDS:
            properties[name] = _field("string", what, format="date-time")
        elif name == "segments":
            segment = {key: _field("integer", what) for key, what in summary.SEGMENT_FIELDS.items()}
            item = _field("object", "A job of the run.", properties=segment)
            properties[name] = _field("array", what, items=item, maxItems=summary.MAX_SEGMENTS)
        elif name in summary.NUMBER_FIELDS:
            properties[name] = _field("number", what)
        else:
            extra = {"format": "int64"} if name in wide else {}
            properties[name] = _field("integer", what, **extra)
    return _field(
        "object",
        "What the run did, written when it ends (Succeeded, or Failed after it had its job) "
        "from the trainer's last report and the controller's own facts; it stays after the "
        "pods and the job are gone. A field no source gave is absent. The full report, with "
        "curves: `megdet report <output folder>`.",
        properties=properties,
    )


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        # The size the run has now (an elastic run's spec.gpus leads it during a resize).
        {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus"},
        {"name": "World", "type": "integer", "jsonPath": ".status.worldSize"},
        {"name": "Batch", "type": "integer", "jsonPath": ".status.globalBatch"},
        {"name": "LR", "type": "number", "jsonPath": ".status.lr"},
        # Progress: percent, the estimated end as a time (a `date` column prints a future time
        # as "<invalid>": kubectl shows the age of a past one only), the last evaluation's AP.
        {"name": "Progress", "type": "integer", "jsonPath": ".status.progress.percent"},
        {"name": "ETA", "type": "string", "jsonPath": ".status.progress.etaTime"},
        {"name": "AP", "type": "number", "jsonPath": ".status.progress.ap"},
        {"name": "Stage", "type": "string", "jsonPath": ".status.stage"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        # kubectl get -o wide.
        {
            "name": "Iteration",
            "type": "integer",
            "jsonPath": ".status.progress.iteration",
            "priority": 1,
        },
        {
            "name": "Images/s",
            "type": "number",
            "jsonPath": ".status.progress.imagesPerSecond",
            "priority": 1,
        },
        {"name": "AP50", "type": "number", "jsonPath": ".status.progress.ap50", "priority": 1},
        {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt", "priority": 1},
        {
            "name": "Checkpoint",
            "type": "integer",
            "jsonPath": ".status.progress.checkpointIteration",
            "priority": 1,
        },
        {
            "name": "Reported",
            "type": "date",
            "jsonPath": ".status.progress.updatedTime",
            "priority": 1,
        },
    ]


def build_crd(chart: Path | None = None) -> dict[str, Any]:
    """The MegDetRun CustomResourceDefinition, generated from the run chart."""
    schema_spec = spec_schema(chart)
    schema = {
        "type": "object",
        "description": "A MegDet training run: the controller validates it, plans it and "
        "creates its job with the run chart.",
        "required": ["spec"],
        "properties": {
            "apiVersion": _field("string", "API version of this object (megdet.io/v1alpha1)."),
            "kind": _field("string", "Kind of this object (MegDetRun)."),
            "metadata": {"type": "object"},
            "spec": schema_spec,
            "status": status_schema(),
        },
        "x-kubernetes-validations": root_rules(schema_spec),
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["megdet"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                }
            ],
        },
    }


def committed_spec_schema() -> Mapping[str, Any]:
    """The spec schema of the committed MegDetRun CRD (:data:`CRD_FILE`), its only version."""
    (version,) = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def crd_yaml(crd: Mapping[str, Any] | None = None) -> str:
    """The CRD as the YAML file `make crd` writes."""
    header = (
        "# Generated by `make crd` (python -m megdet.api.crd) from\n"
        "# charts/megdet/values.schema.json and values.yaml; do not edit. A test fails when this\n"
        "# copy is stale.\n"
    )
    body = yaml.safe_dump(
        dict(crd or build_crd()), sort_keys=False, width=100, default_flow_style=False
    )
    return header + body


def main(argv: list[str] | None = None) -> int:
    """Write the CRD to CRD_FILE (or --output; '-' for stdout)."""
    parser = argparse.ArgumentParser(prog="python -m megdet.api.crd")
    parser.add_argument("--output", default=str(CRD_FILE), help="file to write; - for stdout")
    args = parser.parse_args(argv)
    try:
        text = crd_yaml()
    except MissingDescriptionsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.output == "-":
        sys.stdout.write(text)
    else:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
