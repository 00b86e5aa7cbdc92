"""The run spec and the scaling rules: the one place where a MegDet run is planned.

A :class:`RunSpec` says what the user asks for (GPUs, images per GPU, accumulation, the
reference recipe). :func:`plan_run` turns it into a :class:`Plan`: world size, nodes, global
batch, learning rate and the iteration schedule rescaled so that the number of images seen stays
the same at any scale (the rule detectron2's ``auto_scale_workers`` applies, and the linear
scaling rule of Goyal et al. and MegDet for the learning rate).

This module is pure Python (pydantic only, no torch). The trainer, the controller, the chart
tests and the docs all call it; nothing else computes these numbers.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping
from enum import Enum
from fractions import Fraction
from itertools import pairwise
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from megdet.messages import python_field, python_message

__all__ = [
    "THREE_STAGE_BOUNDARIES",
    "Plan",
    "Resize",
    "RunSpec",
    "Scaling",
    "Schedule",
    "SpecError",
    "parse_spec",
    "plan_continuation",
    "plan_run",
]

#: Fractions of the run at which the three-stage schedule changes stage (seed 000: 30% / 70%).
THREE_STAGE_BOUNDARIES = (Fraction(3, 10), Fraction(7, 10))
#: Where the three-stage schedule ends, as a fraction of its plateau learning rate.
THREE_STAGE_FINAL_FRACTION = 0.1


class Scaling(str, Enum):
    """How the learning rate follows the global batch."""

    LINEAR = "linear"  # lr = base_lr * k (Goyal et al., MegDet)
    SQRT = "sqrt"  # lr = base_lr * sqrt(k)
    NONE = "none"  # lr = base_lr


class Schedule(str, Enum):
    """The shape of the learning-rate curve over iterations."""

    STEP = "step"  # linear warmup, then x gamma at each step (detectron2's WarmupMultiStepLR)
    THREE_STAGE = "three-stage"  # ramp, square-root-shaped decay, linear decay (seed 000)


class Resize(str, Enum):
    """What a run that continues on another number of GPUs keeps."""

    KEEP_BATCH = "keep-batch"  # the global batch, through accumulation (DeepSpeed's way)
    RESCALE = "rescale"  # the spec's accumulation: a new global batch, the scaling rule's LR


class SpecError(ValueError):
    """A run spec that cannot be planned. ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class RunSpec(BaseModel):
    """What the user asks for. Field names are snake_case in Python and camelCase in YAML/CRs.

    The schedule fields (``max_iter``, ``steps``, ``warmup_iters``) and ``base_lr`` describe the
    reference recipe at ``reference_batch`` images per step; :func:`plan_run` rescales them.
    The defaults are detectron2's Faster R-CNN R50-FPN 1x recipe (batch 16, lr 0.02, 90k iters).
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        use_enum_values=False,
    )

    gpus: int = Field(ge=1, description="Total number of GPUs (worker processes) in the run.")
    gpus_per_node: int = Field(default=8, ge=1, description="GPUs per node (pod).")
    images_per_gpu: int = Field(default=2, ge=1, description="Images per GPU per micro-batch.")
    accumulation_steps: int = Field(
        default=1, ge=1, description="Micro-batches accumulated into one optimizer step."
    )
    base_lr: float = Field(
        default=0.02, gt=0, allow_inf_nan=False, description="Learning rate at reference_batch."
    )
    reference_batch: int = Field(
        default=16, ge=1, description="Global batch the reference recipe was tuned for."
    )
    scaling: Scaling = Field(default=Scaling.LINEAR, description="LR scaling rule.")
    schedule: Schedule = Field(default=Schedule.STEP, description="LR curve shape.")
    max_iter: int = Field(default=90000, ge=1, description="Reference length in iterations.")
    steps: tuple[int, ...] = Field(
        default=(60000, 80000), description="Reference LR decay iterations (step schedule)."
    )
    warmup_iters: int = Field(default=1000, ge=0, description="Reference warmup length.")
    warmup_factor: float = Field(
        default=0.001, gt=0, le=1, description="LR multiplier at iteration 0 of the warmup."
    )
    gamma: float = Field(default=0.1, gt=0, le=1, description="LR multiplier at each step.")

    @field_validator(
        "gpus",
        "gpus_per_node",
        "images_per_gpu",
        "accumulation_steps",
        "reference_batch",
        "max_iter",
        "warmup_iters",
        "base_lr",
        "warmup_factor",
        "gamma",
        mode="before",
    )
    @classmethod
    def _no_booleans(cls, value: Any) -> Any:
        # pydantic would read true as 1; a boolean here is always a mistake in the input.
        if isinstance(value, bool):
            raise ValueError("expected a number, got a boolean")
        return value

    @field_validator("steps")
    @classmethod
    def _steps_increasing(cls, steps: tuple[int, ...]) -> tuple[int, ...]:
        if any(s < 1 for s in steps):
            raise ValueError(f"{list(steps)} must all be >= 1")
        if any(b <= a for a, b in pairwise(steps)):
            raise ValueError(python_message("stepsIncreasing", steps=list(steps)))
        return steps

    @model_validator(mode="after")
    def _cross_field_rules(self) -> RunSpec:
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise _CrossFieldError.of(
                "gpusMultiple", gpus=self.gpus, gpusPerNode=self.gpus_per_node
            )
        if self.steps and self.steps[-1] >= self.max_iter:
            raise _CrossFieldError.of(
                "stepsBelowMaxIter", steps=list(self.steps), maxIter=self.max_iter
            )
        if self.warmup_iters >= self.max_iter:
            raise _CrossFieldError.of(
                "warmupBelowMaxIter", warmupIters=self.warmup_iters, maxIter=self.max_iter
            )
        return self


class _CrossFieldError(ValueError):
    """Raised inside validators so that the error can name a field other than the model."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message

    @classmethod
    def of(cls, rule_id: str, **values: Any) -> _CrossFieldError:
        """The error of a rule in megdet.messages, naming the rule's field."""
        return cls(python_field(rule_id), python_message(rule_id, **values))


def _spec_error(rule_id: str, **values: Any) -> SpecError:
    """A SpecError with the message of a rule in megdet.messages."""
    return SpecError(python_field(rule_id), python_message(rule_id, **values))


def _format_validation_error(err: ValidationError) -> SpecError:
    """The first problem in a pydantic error, as a SpecError naming the field and the rule."""
    first = err.errors(include_url=False)[0]
    ctx_error = first.get("ctx", {}).get("error")
    if isinstance(ctx_error, _CrossFieldError):
        return SpecError(ctx_error.field, ctx_error.message)
    loc = [str(p) for p in first.get("loc", ()) if not isinstance(p, int)]
    field = _snake(loc[0]) if loc else "spec"
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        allowed = ", ".join(sorted(RunSpec.model_fields))
        return SpecError(field, f"unknown field; allowed fields: {allowed}")
    if kind == "missing":
        return SpecError(field, "is required")
    message = first.get("msg", "is invalid")
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return SpecError(field, f"{first.get('input')!r} is invalid: {message}")


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def parse_spec(data: Mapping[str, Any] | RunSpec) -> RunSpec:
    """Validate a mapping (snake_case or camelCase keys) into a RunSpec, or raise SpecError."""
    if isinstance(data, RunSpec):
        return data
    if not isinstance(data, Mapping):
        raise SpecError("spec", f"expected a mapping of fields, got {type(data).__name__}")
    try:
        return RunSpec.model_validate(dict(data))
    except ValidationError as err:
        raise _format_validation_error(err) from None


def _round_half_up(x: Fraction) -> int:
    # Exact rational arithmetic: 0.7 * 5625 must round like 3937.5, not like 3937.4999.
    return math.floor(x + Fraction(1, 2))


class Plan(BaseModel):
    """What a run will do. Built only by :func:`plan_run`."""

    model_config = ConfigDict(frozen=True)

    spec: RunSpec
    world_size: int
    nodes: int
    gpus_per_node: int
    procs_per_node: int
    global_batch: int
    scale: float
    lr: float
    max_iter: int
    steps: tuple[int, ...]
    warmup_iters: int
    images_seen: int
    reference_images_seen: int
    #: Where this plan takes over a run that already saw ``images_done`` images (0 for a run
    #: that starts): its first iteration. Iteration ``i`` ends after ``images_at(i + 1)``.
    start_iter: int = 0
    images_done: int = 0
    #: How a continuation chose its global batch, and why (empty for a run that starts).
    resize: Resize | None = None
    resize_reason: str = ""

    @property
    def schedule(self) -> Schedule:
        return self.spec.schedule

    def images_at(self, iterations_done: int) -> int:
        """Images the run has seen once ``iterations_done`` iterations are complete."""
        return self.images_done + (iterations_done - self.start_iter) * self.global_batch

    def scale_iters(self, reference_iters: int) -> int:
        """A reference-scale period (checkpoint, eval) at this scale; at least 1."""
        spec = self.spec
        return max(
            1, _round_half_up(Fraction(reference_iters * spec.reference_batch, self.global_batch))
        )

    def stage_boundaries(self) -> tuple[int, int]:
        """Iterations where the three-stage schedule changes stage."""
        a, b = THREE_STAGE_BOUNDARIES
        return _round_half_up(a * self.max_iter), _round_half_up(b * self.max_iter)

    def lr_at(self, iteration: float) -> float:
        """The learning rate at an iteration (0 <= iteration <= max_iter)."""
        it = min(max(float(iteration), 0.0), float(self.max_iter))
        spec = self.spec
        if spec.schedule is Schedule.STEP:
            factor = 1.0
            if it < self.warmup_iters:
                alpha = it / self.warmup_iters
                factor = spec.warmup_factor * (1 - alpha) + alpha
            return self.lr * factor * spec.gamma ** bisect_right(self.steps, it)
        return self._three_stage_lr(it)

    def _three_stage_lr(self, it: float) -> float:
        # Stage 1 ramps linearly to the scaled peak; stage 2 falls along a square-root curve
        # from the peak to the square-root-scaled plateau; stage 3 falls linearly from the
        # plateau to 10% of it. Each stage starts where the previous one ended, so the curve is
        # continuous (the seed's formulas jump at both boundaries; see docs/plan.md).
        t1, t2 = self.stage_boundaries()
        peak = self.lr
        plateau = min(peak, self.spec.base_lr * math.sqrt(self.scale))
        if it <= t1:
            alpha = it / t1 if t1 else 1.0
            return peak * (self.spec.warmup_factor * (1 - alpha) + alpha)
        if it <= t2:
            r = (it - t1) / (t2 - t1)
            return plateau + (peak - plateau) * math.sqrt(1.0 - r)
        r = (it - t2) / (self.max_iter - t2)
        return plateau * (1.0 - (1.0 - THREE_STAGE_FINAL_FRACTION) * r)

    def summary(self) -> dict[str, Any]:
        """The plan as plain JSON-able data (the `megdet plan --json` output)."""
        out: dict[str, Any] = {
            "world_size": self.world_size,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "procs_per_node": self.procs_per_node,
            "images_per_gpu": self.spec.images_per_gpu,
            "accumulation_steps": self.spec.accumulation_steps,
            "global_batch": self.global_batch,
            "scale": self.scale,
            "scaling": self.spec.scaling.value,
            "schedule": self.spec.schedule.value,
            "lr": self.lr,
            "max_iter": self.max_iter,
            "steps": list(self.steps),
            "warmup_iters": self.warmup_iters,
            "images_seen": self.images_seen,
            "reference_images_seen": self.reference_images_seen,
            "start_iter": self.start_iter,
            "images_done": self.images_done,
        }
        if self.spec.schedule is Schedule.THREE_STAGE:
            out["stage_boundaries"] = list(self.stage_boundaries())
        if self.resize is not None:
            out["resize"] = self.resize.value
            out["resize_reason"] = self.resize_reason
        return out


def plan_run(spec: RunSpec | Mapping[str, Any]) -> Plan:
    """Plan a run: world size, nodes, global batch, LR and the rescaled schedule.

    Raises SpecError (naming the field) for a spec that is invalid or cannot be scaled.
    """
    spec = parse_spec(spec)
    nodes = math.ceil(spec.gpus / spec.gpus_per_node)
    global_batch = spec.gpus * spec.images_per_gpu * spec.accumulation_steps
    k = global_batch / spec.reference_batch
    if spec.scaling is Scaling.LINEAR:
        lr = spec.base_lr * k
    elif spec.scaling is Scaling.SQRT:
        lr = spec.base_lr * math.sqrt(k)
    else:
        lr = spec.base_lr

    def rescale(iters: int) -> int:
        # iters / k, computed exactly (k = global_batch / reference_batch)
        return _round_half_up(Fraction(iters * spec.reference_batch, global_batch))

    max_iter = rescale(spec.max_iter)
    if max_iter < 1:
        raise _spec_error(
            "maxIterTooShort",
            maxIter=spec.max_iter,
            referenceBatch=spec.reference_batch,
            globalBatch=global_batch,
        )
    steps = tuple(rescale(s) for s in spec.steps)
    if spec.schedule is Schedule.STEP and (
        any(b <= a for a, b in pairwise(steps))
        or (steps and (steps[0] < 1 or steps[-1] >= max_iter))
    ):
        raise _spec_error(
            "stepsCollapse",
            steps=list(spec.steps),
            plannedSteps=list(steps),
            globalBatch=global_batch,
            plannedMaxIter=max_iter,
        )
    warmup_iters = rescale(spec.warmup_iters)
    return Plan(
        spec=spec,
        world_size=spec.gpus,
        nodes=nodes,
        gpus_per_node=spec.gpus_per_node,
        procs_per_node=min(spec.gpus, spec.gpus_per_node),
        global_batch=global_batch,
        scale=k,
        lr=lr,
        max_iter=max_iter,
        steps=steps,
        warmup_iters=warmup_iters,
        images_seen=max_iter * global_batch,
        reference_images_seen=spec.max_iter * spec.reference_batch,
    )


def plan_continuation(
    spec: RunSpec | Mapping[str, Any],
    images_done: int,
    *,
    run_batch: int | None = None,
    resize: Resize | str = Resize.KEEP_BATCH,
) -> Plan:
    """The plan for the rest of a run that has seen ``images_done`` images, on ``spec.gpus``.

    The schedule is fixed in images: the total (``reference_images_seen``), every LR milestone
    and the warmup sit at the same image counts as in a run that never changed size. With
    ``resize`` keep-batch and ``run_batch`` (the global batch the run trained at), the
    accumulation is raised or lowered so that the global batch, the learning rate and the whole
    curve stay the run's; when the new world cannot make that batch (``gpus * images_per_gpu``
    does not divide it) or with rescale, the spec's accumulation gives a new global batch and
    the scaling rule its learning rate.

    The returned plan's iterations count in the new global batch ``g``, placed so that
    iteration ``i`` starts after ``images_done + (i - start_iter) * g`` images, with
    ``start_iter = round(images_done / g)``: a milestone at ``M`` reference images is at
    iteration ``start_iter + round((M - images_done) / g)``, so it is applied within half a
    global batch of ``M`` images, and the run ends within half a batch of the planned total.
    With ``images_done`` 0 and no batch to keep, the result is :func:`plan_run`'s exactly.
    """
    spec = parse_spec(spec)
    resize = _resize_mode(resize)
    for name, value, low in (("images_done", images_done, 0), ("run_batch", run_batch, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise SpecError(name, f"{value!r} is invalid: expected a whole number")
        if value is not None and value < low:
            raise SpecError(name, f"{value} is invalid: must be >= {low}")
    used, reason = resize, ""
    per_step = spec.gpus * spec.images_per_gpu
    if resize is Resize.KEEP_BATCH and run_batch is not None:
        if run_batch % per_step == 0:
            spec = spec.model_copy(update={"accumulation_steps": run_batch // per_step})
            reason = (
                f"global batch {run_batch} kept: {spec.gpus} GPUs x {spec.images_per_gpu} "
                f"images x {spec.accumulation_steps} accumulation steps"
            )
        else:
            used = Resize.RESCALE
            made = f"{spec.gpus} GPUs x {spec.images_per_gpu} images per GPU = {per_step}"
            why = "is more than" if per_step > run_batch else "does not divide"
            reason = (
                f"{made} {why} the run's global batch {run_batch}: rescaled by the "
                f"{spec.scaling.value} rule"
            )
    elif run_batch is not None:
        reason = f"rescaled by the {spec.scaling.value} rule, as asked"
    base = plan_run(spec)
    changes: dict[str, Any] = {"resize": used if run_batch is not None else None}
    changes["resize_reason"] = reason
    if images_done:
        g = base.global_batch
        start = _round_half_up(Fraction(images_done, g))

        def at(images: int) -> int:
            return start + _round_half_up(Fraction(images - images_done, g))

        ref = spec.reference_batch
        max_iter = max(start, at(base.reference_images_seen))
        changes.update(
            start_iter=start,
            images_done=images_done,
            max_iter=max_iter,
            steps=tuple(at(s * ref) for s in spec.steps),
            warmup_iters=max(0, at(spec.warmup_iters * ref)) if spec.warmup_iters else 0,
            images_seen=images_done + (max_iter - start) * g,
        )
    return base.model_copy(update=changes)


def _resize_mode(value: Resize | str) -> Resize:
    try:
        return Resize(value)
    except ValueError:
        allowed = ", ".join(r.value for r in Resize)
        raise SpecError("resize", f"{value!r} is invalid: allowed values: {allowed}") from None
