"""The learning-rate curve of a run, taken from its plan.

The curve (warmup and steps, or the three-stage schedule) is ``Plan.lr_at``; this module only
adapts it to detectron2's scheduler seam: an fvcore ``ParamScheduler`` driven by
``LRMultiplier``, which multiplies each parameter group's initial learning rate.
"""

from __future__ import annotations

import torch
from detectron2.solver.lr_scheduler import LRMultiplier
from fvcore.common.param_scheduler import ParamScheduler

from megdet.plan import Plan


class PlanParamScheduler(ParamScheduler):
    """``lr_at(where * max_iter) / lr``: the plan's curve as a multiplier of the planned LR."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan

    def __call__(self, where: float) -> float:
        return self._plan.lr_at(where * self._plan.max_iter) / self._plan.lr


def build_plan_lr_scheduler(optimizer: torch.optim.Optimizer, plan: Plan) -> LRMultiplier:
    """detectron2's LR scheduler following the plan (the optimizer's base LR is ``plan.lr``)."""
    return LRMultiplier(optimizer, multiplier=PlanParamScheduler(plan), max_iter=plan.max_iter)
