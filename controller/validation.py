"""Every check a MegDetRun's spec goes through, as a list of field-named problems.

The layers run in the order the cluster applies them, and each later layer only sees specs the
earlier ones passed (as the API server never hands the controller an object its schema refused):

1. the CRD's structural schema (what ``kubectl apply`` checks), as JSON Schema;
2. the CRD's CEL rules (``x-kubernetes-validations``), evaluated with cel-python;
3. the pydantic ``RunSpec`` and ``plan_run`` (the one source of the scaling rules);
4. owned detectron2 overrides in ``extraOverrides`` (``megdet.overrides.OWNED_OVERRIDES``);
5. the run chart's own template ``fail`` checks (a real render).

Layers 1 and 2 use the CRD generated from the chart's values schema, with the CRD's defaults
applied first, as the API server does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from megdet.controller.problems import InvalidRunError, Problem, field_path
from megdet.controller.render import (
    RUN_SPEC_VALUES,
    default_renderer,
    plain,
    spec_error_problem,
)
from megdet.plan import SpecError, plan_run

__all__ = [
    "Problem",
    "owned_override_problems",
    "plan_problems",
    "validate_run",
]

#: Release name used to render a spec that is validated without a run name.
_PLACEHOLDER_NAME = "megdetrun"


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
    try:
        from megdet.overrides import OWNED_OVERRIDES
    except ImportError:  # the list arrives with the trainer's overrides module
        return []
    overrides = spec.get("extraOverrides") or {}
    if not isinstance(overrides, Mapping):
        return []
    return [
        Problem(
            field_path(["extraOverrides", key]),
            f"{key} is set by the run itself; use spec.{OWNED_OVERRIDES[key]} instead",
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


def validate_run(
    spec: Any, *, name: str = _PLACEHOLDER_NAME, namespace: str = "default"
) -> list[Problem]:
    """Every problem with a MegDetRun spec, each naming a ``spec.`` field path; [] if valid.

    Never raises: any input, however malformed, comes back as problems.
    """
    if not isinstance(spec, Mapping):
        return [Problem("spec", f"expected an object of fields, got {type(spec).__name__}")]
    spec = plain(spec)
    merged = default_renderer().merge(spec)
    for layer in (plan_problems, owned_override_problems):
        problems = layer(merged)
        if problems:
            return problems
    return chart_problems(spec, name, namespace)
