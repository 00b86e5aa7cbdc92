"""The learning-rate curve of a run, taken from its plan.

The curve (warmup and steps, or the three-stage schedule) is ``Plan.lr_at``; this module only
adapts it to detectron2's scheduler seam: an fvcore ``ParamScheduler`` that detectron2's
``hooks.LRScheduler`` drives through ``LRMultiplier``, which multiplies each parameter
group's initial learning rate.
"""

from __future__ import annotations

from fvcore.common.param_scheduler import ParamScheduler

from megdet.plan import Plan


class PlanParamScheduler(ParamScheduler):
    """``lr_at(where * max_iter) / lr``: the plan's curve as a multiplier of the planned LR."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan

    def __call__(self, where: float) -> float:
        return self._plan.lr_at(where * self._plan.max_iter) / self._plan.lr
