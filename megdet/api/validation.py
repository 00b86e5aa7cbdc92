"""Every check a MegDetRun's spec goes through offline, as a list of field-named problems.

This is ``megdet validate`` without a cluster (``megdet/api/cli.py``): what the API server
and the controller would say, with no server at hand. On a cluster the API server applies
layers 1 and 2 itself and the controller only renders (``controller/planning.py``); ``megdet
validate --kubeconfig`` asks the server instead. The layers run in the order the cluster
applies them, and each later layer only sees specs the earlier ones passed:

0. no NaN or Infinity anywhere (JSON, the API's format, has none; YAML does);
1. the CRD's structural schema (what ``kubectl apply`` checks), as JSON Schema;
2. the CRD's CEL rules (``x-kubernetes-validations``, with the rules on ``metadata.name`` when
   the run's name is given; with the old spec, :func:`validate_update`, the transition rules),
   evaluated with a real CEL implementation;
3. the pydantic ``RunSpec`` and ``plan_run`` (the one source of the scaling rules);
4. owned detectron2 overrides in ``extraOverrides`` (``megdet.overrides.OWNED_OVERRIDES``);
5. the run chart's own template ``fail`` checks (a real render).

Layers 1 and 2 use the CRD generated from the chart's values schema, with the CRD's defaults
applied first, as the API server does. docs/architecture.md ("The controller's validation
layers") says where each runs.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from megdet.api.cel_rules import owned_override_cel_message
from megdet.api.crd import build_crd, spec_schema
from megdet.api.schema import (
    apply_defaults,
    cel_problems,
    coerce_numbers,
    schema_problems,
)
from megdet.controller.problems import InvalidRunError, Problem, field_path
from megdet.controller.render import (
    RUN_SPEC_VALUES,
    default_renderer,
    non_finite_problems,
    plain,
    spec_error_problem,
)
from megdet.overrides import OWNED_OVERRIDES
from megdet.plan import SpecError, plan_run

__all__ = [
    "Problem",
    "chart_problems",
    "crd_problems",
    "crd_spec_schema",
    "default_spec",
    "owned_override_problems",
    "plan_problems",
    "validate_run",
    "validate_update",
]

#: The field the CRD's rules on the whole object are about.
ROOT_RULES_FIELD = "metadata.name"

#: Release name used to render a spec that is validated without a run name.
_PLACEHOLDER_NAME = "megdetrun"


@functools.cache
def crd_spec_schema() -> dict[str, Any]:
    """The spec schema of the MegDetRun CRD, generated from the run chart (cached)."""
    return spec_schema(default_renderer().path)


def default_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``spec`` with the CRD's defaults applied, as the API server applies them."""
    return apply_defaults(crd_spec_schema(), plain(spec))


@functools.cache
def _root_rules() -> dict[str, Any]:
    """The CEL rules on the whole object (they read metadata.name and spec)."""
    (version,) = build_crd(default_renderer().path)["spec"]["versions"]
    return {
        "x-kubernetes-validations": version["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    }


def crd_problems(
    spec: Mapping[str, Any], old: Mapping[str, Any] | None = None, name: str | None = None
) -> list[Problem]:
    """What the API server refuses: the structural schema, then the CEL rules (on a defaulted
    spec). With ``old``, transition rules (immutable fields) run too; with ``name``, the rules
    on the whole object (metadata.name)."""
    schema = crd_spec_schema()
    problems = schema_problems(schema, spec)
    if problems:
        return problems
    if old is None:
        problems = cel_problems(schema, spec)
    else:
        problems = cel_problems(schema, spec, default_spec(old))
    if name is not None:
        whole = {"metadata": {"name": name}, "spec": coerce_numbers(schema, spec)}
        # The root rules are all about metadata.name. The CRD cannot say so with fieldPath (the
        # API server resolves it against the schema, where root metadata has no properties),
        # so the server reports them at the object; offline we name the field.
        root = [
            Problem(p.path or ROOT_RULES_FIELD, p.message)
            for p in cel_problems(_root_rules(), whole, root="")
        ]
        problems = root + problems
    return problems


def plan_problems(spec: Mapping[str, Any]) -> list[Problem]:
    """pydantic RunSpec + plan_run over the RunSpec fields of a (defaulted) spec."""
    fields = {name: spec[key] for key, name in RUN_SPEC_VALUES.items() if key in spec}
    try:
        plan_run(fields)
    except SpecError as err:
        return [spec_error_problem(err)]
    return []


def owned_override_problems(spec: Mapping[str, Any]) -> list[Problem]:
    """extraOverrides keys the run owns through a spec field (``megdet.overrides``)."""
    overrides = spec.get("extraOverrides") or {}
    if not isinstance(overrides, Mapping):
        return []
    return [
        Problem(
            field_path(["extraOverrides", key]),
            owned_override_cel_message(key),
        )
        for key in sorted(overrides)
        if key in OWNED_OVERRIDES
    ]


def chart_problems(spec: Mapping[str, Any], name: str, namespace: str) -> list[Problem]:
    """The run chart's own checks: a real render of the spec."""
    try:
        default_renderer().render(name, namespace, spec)
    except InvalidRunError as err:
        return err.problems
    return []


def _validate(spec: Any, old: Any, name: str | None, namespace: str) -> list[Problem]:
    if not isinstance(spec, Mapping):
        return [Problem("spec", f"expected an object, got {type(spec).__name__}")]
    problems = non_finite_problems(spec)
    if problems:
        return problems
    defaulted = default_spec(spec)
    problems = crd_problems(defaulted, old if isinstance(old, Mapping) else None, name)
    if problems:
        return problems
    typed = coerce_numbers(crd_spec_schema(), defaulted)
    for layer in (plan_problems, owned_override_problems):
        problems = layer(typed)
        if problems:
            return problems
    # The spec as the API server hands it over: defaulted (a null in a defaulted field, which
    # Helm would treat as "delete the chart's default", has become the default).
    return chart_problems(defaulted, name or _PLACEHOLDER_NAME, namespace)


def validate_run(
    spec: Any, *, name: str | None = None, namespace: str = "default"
) -> list[Problem]:
    """Every problem with a MegDetRun spec, each naming a field path (``spec.gpus``); [] if valid.

    ``name`` (the run's metadata.name) is checked too when given. Never raises: any input,
    however malformed, comes back as problems.
    """
    try:
        return _validate(spec, None, name, namespace)
    except Exception as err:  # a bug of ours must not take the controller down
        return [Problem("spec", f"could not be validated: {type(err).__name__}: {err}")]


def validate_update(
    old: Any, new: Any, *, name: str | None = None, namespace: str = "default"
) -> list[Problem]:
    """validate_run for an update: also the transition rules (fields fixed at creation)."""
    try:
        return _validate(new, old, name, namespace)
    except Exception as err:  # a bug of ours must not take the controller down
        return [Problem("spec", f"could not be validated: {type(err).__name__}: {err}")]
