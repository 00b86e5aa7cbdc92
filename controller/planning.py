"""What the controller owns for a run, decided without I/O: a MegDetRun body -> the objects
to create (:func:`plan_children`, from one render of the run chart) or the field-named problems
that stop it; which objects are the run's; the output folder two live runs must not share.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from megdet.controller.api import (
    DROPPED_VALUES,
    OWNED_KINDS,
    SUSPEND_PATH,
    TARGET_BY_KIND,
)
from megdet.controller.conditions import had_job
from megdet.controller.job_state import TERMINAL_PHASES
from megdet.controller.ownership import controlled_by, is_runs_job, run_owner
from megdet.controller.problems import InvalidRunError, Problem
from megdet.controller.progress_ca import CA_CONFIG_MAP
from megdet.controller.render import RenderedRun, default_renderer, render_run

__all__ = [
    "DIGEST_ANNOTATION",
    "RUN_ENV",
    "Invalid",
    "OutputClaim",
    "Planned",
    "controlled_by",
    "digest_of",
    "expected_job_name",
    "is_runs_job",
    "merge_patch",
    "operator_value_problems",
    "output_claim",
    "output_holder",
    "output_in_use_message",
    "output_location",
    "plan_children",
    "run_owner",
    "suspend_of",
    "suspend_patch",
    "with_digest",
    "with_progress",
    "with_run_env",
]

logger = logging.getLogger(__name__)

#: Env the controller gives every container of a run, through the chart's ``extraEnv`` (after
#: the user's entries, so these win: the kubelet keeps the last of equal names).
RUN_ENV = ("MEGDET_RUN_UID", "MEGDET_RUN_NAME")

# ------------------------------------------------------------------------------------------
# The pure part: a run -> the objects to own, or the problems that stop it.


@dataclass(frozen=True)
class Invalid:
    """A run the controller refuses; every problem names a field (``spec.gpus``)."""

    problems: tuple[Problem, ...]

    @property
    def messages(self) -> list[str]:
        return [str(p) for p in self.problems]


@dataclass(frozen=True)
class Planned:
    """What the controller creates for a valid run: the adopted objects, job first."""

    rendered: RenderedRun
    objects: tuple[dict[str, Any], ...]

    @property
    def job(self) -> dict[str, Any]:
        return self.objects[0]

    @property
    def target(self) -> str:
        return TARGET_BY_KIND[self.job["kind"]]


def plan_children(
    run: Mapping[str, Any], unsafe_weights: bool = False, progress_url: str = ""
) -> Invalid | Planned:
    """Plan a MegDetRun and render what it owns, once. Never raises for any run body.

    The API server has applied the CRD's checks; here come the ones no CRD can express: the
    operator's values (:func:`operator_value_problems`), then one render of the run chart
    (its ``fail`` checks, ``RunSpec`` + ``plan_run``), whose objects the controller creates.
    ``unsafe_weights``: the policy's ``unsafeWeights`` (the chart's ``allowUnsafeWeights``).
    ``progress_url``: see :func:`with_progress`.
    """
    meta = run.get("metadata") if isinstance(run.get("metadata"), Mapping) else {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name or not isinstance(namespace, str) or not namespace:
        missing = "metadata.name" if not isinstance(name, str) or not name else "metadata.namespace"
        return Invalid((Problem(missing, "a MegDetRun needs a name and a namespace"),))
    spec = run.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        return Invalid((Problem("spec", f"expected an object, got {type(spec).__name__}"),))
    problems = operator_value_problems(spec)
    if problems:
        return Invalid(tuple(problems))
    values = with_run_env(spec, name, meta.get("uid"))
    values = with_progress(values, meta.get("uid"), progress_url)
    if unsafe_weights:
        values = {**values, "allowUnsafeWeights": True}
    try:
        rendered = render_run(name, namespace, values)
    except InvalidRunError as err:
        return Invalid(tuple(err.problems))
    except Exception as err:  # a bug of ours must not take the controller down
        return Invalid((Problem("spec", f"could not be planned: {type(err).__name__}: {err}"),))
    # The render's job is of a kind in TARGET_BY_KIND; any object (the job too) of a kind
    # outside the ClusterRole would fail with 403 on every retry.
    unknown = [
        o.get("kind")
        for o in rendered.objects
        if (o.get("apiVersion"), o.get("kind")) not in OWNED_KINDS
    ]
    if unknown:
        return Invalid(
            (Problem("spec", f"the chart rendered kinds the controller cannot own: {unknown}"),)
        )
    objects = list(rendered.objects)  # a fresh render: ours to adopt
    kopf.adopt(objects, owner=dict(run))
    return Planned(rendered=rendered, objects=tuple(objects))


def operator_value_problems(spec: Mapping[str, Any]) -> list[Problem]:
    """Run chart values that are not the run author's (:data:`DROPPED_VALUES`): the CRD has no
    such fields, so a spec that still carries one (a CRD installed without its schema) is
    refused rather than rendered with the author's value."""
    return [
        Problem(f"spec.{key}", "unknown field: set by the operator, not a MegDetRun field")
        for key in DROPPED_VALUES
        if key in spec
    ]


def with_progress(spec: Any, uid: Any, url: str) -> Any:
    """``spec`` with the chart value ``progress``: ``url``, the base URL of the controller's
    progress endpoint (``--progress-url``; "": off), the CA ConfigMap and the run's ``uid``.
    Not a MegDetRun field, so added after validation, for the render only
    (docs/architecture.md, "Progress reporting")."""
    if not url or not isinstance(spec, Mapping):
        return spec
    run_uid = uid if isinstance(uid, str) else ""
    return {
        **spec,
        "progress": {"url": url, "caConfigMap": CA_CONFIG_MAP, "runUID": run_uid},
    }


def with_run_env(spec: Any, name: str, uid: Any) -> Any:
    """``spec`` with ``MEGDET_RUN_UID`` and ``MEGDET_RUN_NAME`` appended to ``extraEnv`` (which the
    chart appends to every container's env); a spec it cannot extend is returned unchanged."""
    if not isinstance(spec, Mapping):
        return spec
    extra = spec.get("extraEnv")
    if extra is None:
        extra = []
    if not isinstance(extra, list | tuple):
        return spec
    env = [{"name": RUN_ENV[1], "value": name}]
    if isinstance(uid, str) and uid:
        env.insert(0, {"name": RUN_ENV[0], "value": uid})
    return {**spec, "extraEnv": [*extra, *env]}


def expected_job_name(run: Mapping[str, Any]) -> str | None:
    """The name of the run's job: ``status.jobName``, else the run's name (the chart names the
    job after the release, and the controller renders with the run's name as the release)."""
    status = run.get("status") if isinstance(run.get("status"), Mapping) else {}
    name = status.get("jobName") or (run.get("metadata") or {}).get("name")
    return name if isinstance(name, str) else None


# ------------------------------------------------------------------------------------------
# The run's objects that follow its spec after creation (the NetworkPolicy).

#: The annotation with the digest of what the controller rendered for an object that follows
#: the spec: a changed render changes it; fields the API server defaults do not.
DIGEST_ANNOTATION = "megdet.io/rendered-digest"


def _digest(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    essence = {
        "labels": meta.get("labels") or {},
        "annotations": {
            k: v for k, v in (meta.get("annotations") or {}).items() if k != DIGEST_ANNOTATION
        },
        "spec": obj.get("spec"),
    }
    text = json.dumps(essence, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def with_digest(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with :data:`DIGEST_ANNOTATION` set to the digest of its labels, annotations and
    spec (a copy)."""
    meta = dict(obj.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), DIGEST_ANNOTATION: _digest(obj)}
    return {**obj, "metadata": meta}


def digest_of(obj: Mapping[str, Any]) -> str | None:
    """The digest an object carries (None: none, or not a string)."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    value = annotations.get(DIGEST_ANNOTATION)
    return value if isinstance(value, str) else None


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: keys ``new`` lacks are
    set to null (removed), objects are patched key by key, anything else is replaced whole."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return copy.deepcopy(new)
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = copy.deepcopy(value)
        elif old[key] != value:
            patch[key] = merge_patch(old[key], value)
    return patch


# ------------------------------------------------------------------------------------------
# Output folders: two live runs must not write one folder.


@functools.cache
def _default_output_claim() -> str:
    output = default_renderer().defaults.get("output")
    claim = output.get("claimName") if isinstance(output, Mapping) else None
    return claim if isinstance(claim, str) else ""


def output_location(run: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(namespace, PVC, folder) the run's pods write: ``spec.output.claimName`` (or the chart's
    default), folder ``/output/<spec.runName or the run's name>``; None for a malformed spec."""
    meta = run.get("metadata") if isinstance(run.get("metadata"), Mapping) else {}
    name, namespace = meta.get("name"), meta.get("namespace")
    spec = run.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(name, str) or not isinstance(namespace, str) or not isinstance(spec, Mapping):
        return None
    output = spec.get("output")
    if output is None:
        output = {}
    if not isinstance(output, Mapping):
        return None
    claim = output.get("claimName")
    if claim is None:
        claim = _default_output_claim()
    folder = spec.get("runName") or name
    if not isinstance(claim, str) or not claim or not isinstance(folder, str):
        return None
    return namespace, claim, folder


@dataclass(frozen=True)
class OutputClaim:
    """One run's entry in the ``megdet_outputs`` index (key: :func:`output_location`)."""

    name: str
    uid: str | None
    #: metadata.creationTimestamp ("" when unknown): the older of two waiting runs goes first.
    created: str
    #: The run has (had) its job: it goes first, whatever its age.
    has_job: bool
    #: The run may write the folder: not deleted, not finished, not Invalid without a job.
    live: bool
    phase: str | None


def output_claim(body: Mapping[str, Any]) -> dict[tuple[str, str, str], OutputClaim]:
    """The ``megdet_outputs`` index function: {output location: this run's claim}. Never raises
    (a body it cannot read indexes as nothing)."""
    try:
        key = output_location(body)
        if key is None:
            return {}
        meta = body.get("metadata") or {}
        status = body.get("status") if isinstance(body.get("status"), Mapping) else {}
        phase = status.get("phase")
        has_job = had_job(status)
        live = (
            not meta.get("deletionTimestamp")
            and phase not in TERMINAL_PHASES
            and not (phase == "Invalid" and not has_job)
        )
        claim = OutputClaim(
            name=str(meta.get("name")),
            uid=meta.get("uid"),
            created=str(meta.get("creationTimestamp") or ""),
            has_job=has_job,
            live=bool(live),
            phase=phase if isinstance(phase, str) else None,
        )
    except Exception as err:  # an index function that raises is retried by kopf on every event
        logger.warning(
            "cannot index the output folder of a MegDetRun: %s: %s", type(err).__name__, err
        )
        return {}
    return {key: claim}


def output_holder(index: Mapping[Any, Any] | None, run: Mapping[str, Any]) -> OutputClaim | None:
    """The other live run that goes before ``run`` at its output folder, if any: one with a job,
    else the older (docs/controller.md, "One output folder, one live run")."""
    key = output_location(run)
    if index is None or key is None:
        return None
    meta = run.get("metadata") or {}
    me = (str(meta.get("creationTimestamp") or ""), str(meta.get("name")))
    for _ in range(3):  # kopf updates the index on its loop while this thread reads it
        try:
            claims = list(index[key]) if key in index else []
            break
        except RuntimeError:
            continue
    else:
        return None
    before = [
        c
        for c in claims
        if c.live and c.uid != meta.get("uid") and (c.has_job or (c.created, c.name) < me)
    ]
    return min(before, key=lambda c: (not c.has_job, c.created, c.name), default=None)


def output_in_use_message(run: Mapping[str, Any], other: OutputClaim) -> str:
    _namespace, claim, folder = output_location(run) or ("", "", "")
    state = other.phase or "not started"
    return (
        f"the output folder /output/{folder} on PVC {claim} (spec.output.claimName, "
        f"spec.runName) is in use by MegDetRun {other.name} (phase {state}"
        f"{', job created' if other.has_job else ''}); two runs writing one folder overwrite "
        f"each other's checkpoints. This run's job is created once {other.name} has ended or "
        "is deleted (checked every 30 s); to run both, delete this run and re-create it with "
        "another spec.runName or spec.output.claimName"
    )


def suspend_of(obj: Mapping[str, Any]) -> bool:
    """The job's suspend flag (False when unset)."""
    value: Any = obj
    for key in SUSPEND_PATH[obj["kind"]]:
        value = value.get(key) if isinstance(value, Mapping) else None
    return bool(value)


def suspend_patch(kind: str, suspend: bool) -> dict[str, Any]:
    """A merge patch that sets the job's suspend flag."""
    patch: dict[str, Any] = {}
    node = patch
    *parents, leaf = SUSPEND_PATH[kind]
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = suspend
    return patch
