"""A MegDetRun's spec -> the objects the run chart renders for it, in process.

The controller renders ``charts/megdet`` with the real Helm engine (helm-python-sdk), as
``helm install <run> charts/megdet`` would with the spec as values, and creates what it renders.
Why, and how the values schema is checked once and renders are kept: docs/architecture.md,
"The controller".
"""

from __future__ import annotations

import collections
import copy
import functools
import io
import json
import logging
import math
import os
import re
import tarfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml
from pydantic.alias_generators import to_camel

from megdet.controller.api import JOB_KINDS
from megdet.controller.problems import InvalidRunError, Problem, field_path
from megdet.controller.values_schema import SCHEMA_FILE, ValuesSchema
from megdet.messages import cel_message
from megdet.plan import Plan, RunSpec, SpecError, plan_run

__all__ = [
    "CHART_DIR_ENV",
    "MANAGED_BY",
    "RUN_SPEC_VALUES",
    "ChartRenderer",
    "RenderedRun",
    "chart_dir",
    "default_renderer",
    "forget_run",
    "non_finite_problems",
    "plain",
    "render_run",
    "spec_error_problem",
    "split_manifests",
]

logger = logging.getLogger(__name__)

#: Environment variable naming the run chart's folder (the controller image sets it).
CHART_DIR_ENV = "MEGDET_CHART_DIR"
#: The app.kubernetes.io/managed-by label on what the controller creates (the chart writes
#: Helm's `.Release.Service`, "Helm": no Helm release owns them).
MANAGED_BY = "megdet-controller"
#: Chart value name (camelCase) -> RunSpec field (snake_case), for every RunSpec field.
RUN_SPEC_VALUES: dict[str, str] = {to_camel(name): name for name in RunSpec.model_fields}

# Helm's template `fail`: "execution error at (megdet/templates/x.yaml:1:4): <message>".
_EXECUTION_ERROR = re.compile(r"execution error at \([^)]*\):\s*(?P<message>.*)", re.DOTALL)
# The chart's fail messages start with the value they are about: "gpus=12 is not ..." or
# "extraOverrides: SOLVER.BASE_LR is set by ...".
_FAIL_FIELD = re.compile(r"^(?P<field>[A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z][A-Za-z0-9]*)*)(?:=|: )")
# Helm's values-schema errors, one per line: "- at '/nccl/ib/hca': <message>".
_SCHEMA_ERROR = re.compile(r"^(?P<indent>\s*)- at '(?P<pointer>[^']*)': (?P<message>.*)$")
_ADDITIONAL = re.compile(
    r"additional propert(?:y|ies) (?P<names>'[^']*'(?:, '[^']*')*) not allowed"
)
_MISSING = re.compile(r"missing propert(?:y|ies) (?P<names>'[^']*'(?:, '[^']*')*)")
_PATTERN = re.compile(r"^(?P<value>'.*') does not match pattern ")


# libyaml's parser when PyYAML has it: a rendered job parses ~10x faster than in pure Python.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def chart_dir() -> Path:
    """The run chart: ``$MEGDET_CHART_DIR``, else the repository's ``charts/megdet``."""
    env = os.environ.get(CHART_DIR_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / "charts" / "megdet"


def plain(value: Any) -> Any:
    """A deep copy as plain dicts and lists (kopf hands specs over as read-only mappings)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [plain(v) for v in value]
    return copy.deepcopy(value)


def non_finite_problems(value: Any, parts: tuple[str | int, ...] = ()) -> list[Problem]:
    """NaN and infinities anywhere in a spec: JSON (the API's and Helm's values format) has
    none, so such a value can only come from YAML (``.nan``, ``.inf``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return [Problem(field_path(parts), f"{value} is not a finite number (JSON has none)")]
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in non_finite_problems(v, (*parts, str(k)))]
    if isinstance(value, list | tuple):
        return [p for i, v in enumerate(value) for p in non_finite_problems(v, (*parts, i))]
    return []


def spec_error_problem(err: SpecError) -> Problem:
    """A plan error as a Problem on the CR's camelCase field, with camelCase names in the text."""
    message = err.message
    # Longest first: "gpus_per_node" must not be half-replaced by "gpus".
    for snake in sorted(RunSpec.model_fields, key=len, reverse=True):
        if "_" in snake:
            message = re.sub(rf"\b{snake}\b", to_camel(snake), message)
    return Problem(field_path([to_camel(err.field)]), message)


@dataclass(frozen=True)
class RenderedRun:
    """What the chart renders for one run, and the plan it was rendered for."""

    name: str
    namespace: str
    values: dict[str, Any]
    objects: tuple[dict[str, Any], ...]
    plan: Plan

    @property
    def job(self) -> dict[str, Any]:
        """The PyTorchJob (or TrainJob) to create; no owner reference yet."""
        return self.objects[0]

    def status_plan(self) -> dict[str, Any]:
        """The plan as the run's status fields."""
        plan = self.plan
        return {
            "worldSize": plan.world_size,
            "nodes": plan.nodes,
            "globalBatch": plan.global_batch,
            "lr": plan.lr,
            "maxIter": plan.max_iter,
            "steps": list(plan.steps),
            "warmupIters": plan.warmup_iters,
        }


#: What the chart the controller renders leaves out: the values schema (checked in process by
#: :class:`ValuesSchema`) and the NOTES (text for `helm install`'s user, no check of its own).
LEFT_OUT = (SCHEMA_FILE, "templates/NOTES.txt")


def _load_unchecked(chart: helm_python.Chart, path: Path) -> helm_python.Chart | None:
    """The chart at ``path`` (a directory) as Helm loaded it (the files Helm read there), without
    :data:`LEFT_OUT`; None when it cannot be rebuilt so (every render is then checked by Helm)."""
    if not path.is_dir() or chart.dependencies or (path / "charts").exists():
        return None
    names = ["Chart.yaml"] + [
        item["name"] for item in (*chart.templates, *chart.files, *chart.crds)
    ]
    if (path / "values.yaml").is_file():  # optional in a chart
        names.append("values.yaml")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name in names:
            if name in LEFT_OUT:
                continue
            if not (path / name).is_file():
                return None
            data = (path / name).read_bytes()
            info = tarfile.TarInfo(f"{chart.name}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return helm_python.Chart.load_archive(buffer.getvalue())


#: Runs whose last render :class:`ChartRenderer` keeps (a render's objects and merged values
#: are 20-40 KiB of Python objects: 64 runs are a few MiB).
MEMO_SIZE = 64


class ChartRenderer:
    """The run chart, loaded once; renders runs (thread-safe: one render at a time).

    ``memo_size``: runs whose last render is kept and reused while their inputs stay the same
    (0: none)."""

    def __init__(self, path: Path | str | None = None, memo_size: int = MEMO_SIZE) -> None:
        self.path = Path(path) if path is not None else chart_dir()
        self._chart = helm_python.Chart.load(str(self.path))
        #: The values schema compiled in process, and the chart without it (None: every
        #: render is checked by Helm).
        self._schema = ValuesSchema(self._chart.schema) if self._chart.schema else None
        self._unchecked = None
        if self._schema is not None and self._schema.unlike_helm:
            logger.warning("%s of %s is checked by Helm on every render (slower): %s",
                           SCHEMA_FILE, self.path, self._schema.unlike_helm)  # fmt: skip
        elif self._schema is not None:
            self._unchecked = _load_unchecked(self._chart, self.path)
        self._lock = threading.Lock()
        self.memo_size = memo_size
        #: (namespace, name) -> (the inputs as canonical JSON, that render), oldest first.
        self._memo: collections.OrderedDict[tuple[str, str], tuple[str, RenderedRun]] = (
            collections.OrderedDict()
        )
        self._memo_lock = threading.Lock()
        self.renders = 0
        self.reused = 0
        #: Renders whose values the in-process schema passed (Helm's check skipped).
        self.prechecked = 0

    def memo_keys(self) -> list[tuple[str, str]]:
        """The (namespace, name) of the runs whose last render is kept."""
        with self._memo_lock:
            return list(self._memo)

    def forget(self, namespace: str, name: str) -> None:
        """Drop the run's kept render (the run is deleted)."""
        with self._memo_lock:
            self._memo.pop((namespace, name), None)

    def _recall(self, key: tuple[str, str], inputs: str | None) -> RenderedRun | None:
        if inputs is None or not self.memo_size:
            return None
        with self._memo_lock:
            kept = self._memo.get(key)
            if kept is None or kept[0] != inputs:
                return None
            self._memo.move_to_end(key)
            self.reused += 1
            return _copy_rendered(kept[1])

    def _keep(self, key: tuple[str, str], inputs: str | None, rendered: RenderedRun) -> None:
        if inputs is None or not self.memo_size:
            return
        kept = _copy_rendered(rendered)  # the caller adopts (mutates) the objects it gets
        with self._memo_lock:
            self._memo[key] = (inputs, kept)
            self._memo.move_to_end(key)
            while len(self._memo) > self.memo_size:
                self._memo.popitem(last=False)

    @property
    def defaults(self) -> dict[str, Any]:
        """The chart's values.yaml, as Helm read it."""
        return copy.deepcopy(self._chart.values)

    def values(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Chart values for a run: the spec itself, and the run's name as fullnameOverride."""
        values = plain(spec)
        values["fullnameOverride"] = name
        return values

    def render(self, name: str, namespace: str, spec: Mapping[str, Any]) -> RenderedRun:
        """Render the chart for a run (:meth:`values`), then plan it on the merged values;
        InvalidRunError names the fields at fault."""
        problems = non_finite_problems(spec)
        if problems:
            raise InvalidRunError(problems)
        values = self.values(name, spec)
        inputs = _inputs_key(namespace, values)
        recalled = self._recall((namespace, name), inputs)
        if recalled is not None:
            return recalled
        rendered = self._render(name, namespace, values)
        self._keep((namespace, name), inputs, rendered)
        return rendered

    def _render(self, name: str, namespace: str, values: dict[str, Any]) -> RenderedRun:
        self.renders += 1
        with self._lock:
            chart, merged = self._chart, None
            if self._unchecked is not None and self._schema is not None:
                try:
                    merged = self._chart.merge_values(values)
                except helm_python.HelmError:
                    merged = None  # the checked render says why
                if merged is not None and self._schema.passes(merged):
                    chart = self._unchecked
                    self.prechecked += 1
            try:
                files = chart.render(values=values, name=name, namespace=namespace, is_install=True)
            except helm_python.HelmError as err:
                raise InvalidRunError(helm_problems(str(err))) from None
            if merged is None:
                merged = self._chart.merge_values(values)
        plan = _plan(merged)
        objects, _notes = _parse_manifests(files)
        for obj in objects:
            labels = obj.get("metadata", {}).get("labels")
            if isinstance(labels, dict) and "app.kubernetes.io/managed-by" in labels:
                labels["app.kubernetes.io/managed-by"] = MANAGED_BY
        jobs = [o for o in objects if o.get("kind") in JOB_KINDS]
        if len(jobs) != 1:
            kinds = [o.get("kind") for o in objects]
            raise InvalidRunError(
                [Problem("spec", f"the chart rendered {len(jobs)} jobs (objects: {kinds})")]
            )
        others = [o for o in objects if o is not jobs[0]]
        return RenderedRun(
            name=name,
            namespace=namespace,
            values=merged,
            objects=(jobs[0], *others),
            plan=plan,
        )


def _inputs_key(namespace: str, values: Mapping[str, Any]) -> str | None:
    """A render's inputs as canonical JSON (None: not JSON, so not kept)."""
    try:
        return json.dumps([namespace, values], sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None


def _tree(value: Any) -> Any:
    """A copy of parsed YAML/JSON: new dicts and lists, the scalars (immutable) shared; 10x
    faster than copy.deepcopy, which would make a reused render cost half a render."""
    if type(value) is dict:
        return {k: _tree(v) for k, v in value.items()}
    if type(value) is list:
        return [_tree(v) for v in value]
    return value


def _copy_rendered(rendered: RenderedRun) -> RenderedRun:
    return RenderedRun(
        name=rendered.name,
        namespace=rendered.namespace,
        values=_tree(rendered.values),
        objects=tuple(_tree(o) for o in rendered.objects),
        plan=rendered.plan,
    )


def split_manifests(files: Mapping[str, str]) -> tuple[list[dict[str, Any]], str]:
    """A Helm render's files -> (every object, in file order; the NOTES text). Raises
    yaml.YAMLError, naming the file, for one that does not parse (the tests read renders so too)."""
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(files.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        try:
            objects += [doc for doc in yaml.load_all(text, Loader=_YAML_LOADER) if doc]
        except yaml.YAMLError as err:
            raise yaml.YAMLError(f"{path}: {err}") from err
    return objects, notes


def _parse_manifests(files: Mapping[str, str]) -> tuple[list[dict[str, Any]], str]:
    try:
        return split_manifests(files)
    except yaml.YAMLError as err:
        # A value the chart pasted unquoted into its YAML; the values schema should
        # have refused it (its patterns exist for this), so say where to look.
        problem = Problem("spec", "the chart rendered YAML that does not parse "
                          f"(a value with YAML syntax in it?): {err}")  # fmt: skip
        raise InvalidRunError([problem]) from None


def _plan(values: Mapping[str, Any]) -> Plan:
    """plan_run over the RunSpec fields of the merged chart values."""
    spec = {name: values[key] for key, name in RUN_SPEC_VALUES.items() if key in values}
    try:
        return plan_run(spec)
    except SpecError as err:
        raise InvalidRunError([spec_error_problem(err)]) from None


def helm_problems(text: str) -> list[Problem]:
    """Helm's error text as Problems: template `fail`s and values-schema errors."""
    match = _EXECUTION_ERROR.search(text)
    if match:
        message = match.group("message").strip()
        named = _FAIL_FIELD.match(message)
        path = field_path(named.group("field").split(".")) if named else "spec"
        return [Problem(path, message)]
    problems: list[Problem] = []
    for line in text.splitlines():
        found = _SCHEMA_ERROR.match(line)
        if not found:
            continue
        if found.group("indent") and problems:
            # A nested reason (oneOf branches) belongs to the problem above it.
            last = problems.pop()
            problems.append(Problem(last.path, f"{last.message}; {found.group('message')}"))
            continue
        problems += _schema_problems(found.group("pointer"), found.group("message"))
    return problems or [Problem("spec", text.strip())]


def _schema_problems(pointer: str, message: str) -> list[Problem]:
    parts: list[str | int] = [
        int(p) if p.isdigit() else p.replace("~1", "/").replace("~0", "~")
        for p in pointer.split("/")[1:]
    ]
    if _PATTERN.search(message):
        said = _pattern_message(parts)
        if said is not None:
            value = _PATTERN.search(message).group("value")  # type: ignore[union-attr]
            return [Problem(field_path(parts), f"{value} {said}")]
    for pattern, what in ((_ADDITIONAL, "unknown field"), (_MISSING, "is required")):
        found = pattern.search(message)
        if found:
            names = re.findall(r"'([^']*)'", found.group("names"))
            return [Problem(field_path([*parts, n]), what) for n in names]
    return [Problem(field_path(parts), message)]


@functools.cache
def _values_schema() -> dict[str, Any]:
    return json.loads((chart_dir() / SCHEMA_FILE).read_text())


def _pattern_message(parts: Sequence[str | int]) -> str | None:
    """The message of the ``patternMessageRef`` of the values-schema node at ``parts`` (what a
    value of it must look like, in words; megdet/messages.py), if it has one."""
    node: Any = _values_schema()
    for part in parts:
        if not isinstance(node, Mapping):
            return None
        if isinstance(part, int):
            node = node.get("items")
        else:
            props = node.get("properties") or {}
            node = props.get(part, node.get("additionalProperties"))
    ref = node.get("patternMessageRef") if isinstance(node, Mapping) else None
    return cel_message(ref) if isinstance(ref, str) else None


@functools.cache
def default_renderer() -> ChartRenderer:
    """The process-wide renderer for :func:`chart_dir` (loaded on first use)."""
    return ChartRenderer()


def render_run(name: str, namespace: str, spec: Mapping[str, Any]) -> RenderedRun:
    """Render a MegDetRun with the run chart: its job (first), every other object, its plan;
    InvalidRunError (each problem naming a ``spec.`` field) for a spec the chart or plan refuses."""
    return default_renderer().render(name, namespace, spec)


def forget_run(namespace: str, name: str) -> None:
    """Drop the run's kept render from the process-wide renderer (the run is deleted)."""
    if default_renderer.cache_info().currsize:  # never load the chart just to forget
        default_renderer().forget(namespace, name)
