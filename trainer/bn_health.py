"""SyncBN health: is synchronized BatchNorm really synchronizing?

With synchronized BN every rank of a BN group computes the same batch statistics, so the BN
layers' running means and variances stay identical across the group. With local BN (scope
``none``) each rank's running statistics follow its own images and drift apart. Every
``MEGDET.SYNCBN_CHECK_PERIOD`` iterations :class:`SyncBNHealthCheck` measures the largest
absolute difference of the backbone BN running statistics between ranks of the same BN group
and puts it into detectron2's event storage (``syncbn/divergence_mean``,
``syncbn/divergence_var``): the console/JSON writers log it and the Prometheus exporter exports
it as ``megdet_syncbn_divergence{stat}``.

The largest pairwise difference of a value across ranks is its max minus its min, so one
all-reduce (MAX) of ``[stats, -stats]`` over the BN group gives it with traffic independent of
the group size; an all-gather would move ``group_size`` times more bytes for the same answer.
A second, 2-float all-reduce takes the maximum over BN groups.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from detectron2.engine import hooks
from detectron2.utils import comm
from torch import nn

from megdet.trainer.sync_bn import build_bn_process_group, sync_bn_root

logger = logging.getLogger(__name__)

#: Event-storage keys of the two divergences.
DIVERGENCE_KEYS = {"mean": "syncbn/divergence_mean", "var": "syncbn/divergence_var"}


def backbone_bn_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The backbone's BN layers with running statistics (any BN class; frozen BN excluded).

    "Backbone" is the part the ``backbone`` SyncBN scope synchronizes (the ResNet bottom-up),
    whatever scope the run uses: with scope ``none`` these are the layers that drift apart.
    """
    root = sync_bn_root(model, "backbone")
    return [
        m
        for m in root.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None
    ]


def bn_divergence(layers: list[nn.Module], group=None) -> dict[str, float]:
    """Largest |difference| of running mean and running var between ranks of a BN group.

    Collective: every rank of the world calls it with the same layer shapes; ``group`` is this
    rank's BN group (None: the whole world). Returns ``{"mean": ..., "var": ...}``, the maxima
    over all channels, layers and BN groups.
    """
    means = torch.cat([m.running_mean.detach().float().flatten() for m in layers])
    variances = torch.cat([m.running_var.detach().float().flatten() for m in layers])
    stats = torch.cat([means, variances])
    packed = torch.cat([stats, -stats])
    dist.all_reduce(packed, op=dist.ReduceOp.MAX, group=group)
    size = stats.numel()
    spread = packed[:size] + packed[size:]  # max - min over the group, per element
    worst = torch.stack([spread[: means.numel()].max(), spread[means.numel() :].max()])
    if group is not None:  # BN groups: the worst group counts
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    mean, var = worst.tolist()
    return {"mean": mean, "var": var}


class SyncBNHealthCheck(hooks.HookBase):
    """Every ``period`` iterations (and after the last), put the BN divergence into storage.

    Must be registered on every rank (the check is collective).
    """

    def __init__(self, period: int, bn_group_size: int) -> None:
        self._period = period
        self._bn_group_size = bn_group_size
        self._layers: list[nn.Module] = []
        self._group = None
        #: The last measurement (also in the event storage).
        self.last: dict[str, float] | None = None

    def before_train(self) -> None:
        self._layers = backbone_bn_layers(self.trainer.model)
        # Collective: every rank creates the same groups in the same order.
        self._group = build_bn_process_group(self._bn_group_size)

    def after_step(self) -> None:
        done = self.trainer.iter + 1
        if not self._layers or (done % self._period and done != self.trainer.max_iter):
            return
        self.last = bn_divergence(self._layers, self._group)
        self.trainer.storage.put_scalars(
            **{DIVERGENCE_KEYS[stat]: value for stat, value in self.last.items()},
            smoothing_hint=False,
        )


def build_health_check(cfg, model: nn.Module) -> SyncBNHealthCheck | None:
    """The check for this run, or None (one process, period 0, or no BN in the backbone)."""
    period = cfg.MEGDET.SYNCBN_CHECK_PERIOD
    if comm.get_world_size() == 1 or period == 0:
        return None
    if not backbone_bn_layers(model):
        logger.info("SyncBN health check off: the backbone has no BatchNorm with statistics")
        return None
    return SyncBNHealthCheck(period, cfg.MEGDET.BN_GROUP_SIZE)
