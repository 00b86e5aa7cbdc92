"""Partial synchronized BatchNorm: convert a model's BN layers by scope, optionally in groups.

MegDet's Cross-GPU BN computes batch statistics over all workers of a BN group. Which layers
are synchronized is the *scope*: ``backbone`` (the ResNet bottom-up only; FPN and heads keep
their own norm), ``all`` or ``none``. On CUDA with NCCL the layers become
``torch.nn.SyncBatchNorm``; elsewhere (CPU with gloo) they become :class:`GroupNaiveSyncBatchNorm`,
detectron2's ``NaiveSyncBatchNorm`` restricted to a process group.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from detectron2.layers import NaiveSyncBatchNorm
from torch import nn

__all__ = [
    "GroupNaiveSyncBatchNorm",
    "build_bn_process_group",
    "convert_sync_batchnorm",
    "sync_bn_root",
]


class _GroupAllReduce(torch.autograd.Function):
    """Sum over a process group in forward; the gradient is summed over the group too."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class GroupNaiveSyncBatchNorm(NaiveSyncBatchNorm):
    """``NaiveSyncBatchNorm`` whose statistics are averaged over one process group.

    ``process_group=None`` means the whole world. Every worker of a group must pass the same
    batch shape (true for detectron2's fixed-size batches), so equal weights per worker give the
    statistics of the concatenated batch.
    """

    def __init__(self, *args, process_group=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.process_group = process_group

    def _group_size(self) -> int:
        if not dist.is_available() or not dist.is_initialized():
            return 1
        return dist.get_world_size(self.process_group)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        group_size = self._group_size()
        if group_size == 1 or not self.training:
            return nn.BatchNorm2d.forward(self, input)
        channels = input.shape[1]
        half_input = input.dtype == torch.float16
        if half_input:
            input = input.float()  # the reduction needs fp32 precision
        mean = input.mean(dim=[0, 2, 3])
        meansqr = (input * input).mean(dim=[0, 2, 3])
        vec = _GroupAllReduce.apply(torch.cat([mean, meansqr]), self.process_group) / group_size
        mean, meansqr = torch.split(vec, channels)
        var = meansqr - mean * mean
        scale = self.weight * torch.rsqrt(var + self.eps)
        bias = self.bias - mean * scale
        with torch.no_grad():
            self.running_mean += self.momentum * (mean.detach() - self.running_mean)
            # Unbiased variance for the running estimate, like nn.BatchNorm2d.
            n = input.numel() / channels * group_size
            unbiased = var.detach() * (n / max(n - 1, 1))
            self.running_var += self.momentum * (unbiased - self.running_var)
            self.num_batches_tracked += 1
        out = input * scale.reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1)
        return out.half() if half_input else out


def build_bn_process_group(group_size: int):
    """The process group of this rank's BN group of ``group_size`` consecutive ranks.

    0 or the world size: None (the whole world). Every rank must call this, in the same order,
    because ``new_group`` is collective.
    """
    world = dist.get_world_size() if dist.is_initialized() else 1
    if group_size in (0, world):
        return None
    if group_size < 0 or world % group_size:
        raise ValueError(
            f"MEGDET.BN_GROUP_SIZE: {group_size} must be 0 (the whole world) or divide the "
            f"world size {world}"
        )
    rank = dist.get_rank()
    mine = None
    for start in range(0, world, group_size):
        group = dist.new_group(list(range(start, start + group_size)))
        if start <= rank < start + group_size:
            mine = group
    return mine


def sync_bn_root(model: nn.Module, scope: str) -> nn.Module | None:
    """The submodule whose BN layers a scope synchronizes (None for ``none``)."""
    model = getattr(model, "module", model)  # a DDP wrapper
    if scope == "none":
        return None
    if scope == "all":
        return model
    if scope == "backbone":
        backbone = getattr(model, "backbone", None)
        if backbone is None:
            raise ValueError("MEGDET.SYNC_BN: 'backbone' needs a model with a .backbone")
        # FPN wraps the ResNet as .bottom_up; a plain ResNet backbone is the bottom-up itself.
        return getattr(backbone, "bottom_up", backbone)
    raise ValueError(f"MEGDET.SYNC_BN: {scope!r} is invalid; allowed values: backbone, all, none")


def _default_factory(process_group) -> Callable[[nn.BatchNorm2d], nn.Module]:
    use_torch_sync = (
        torch.cuda.is_available()
        and dist.is_initialized()
        and dist.get_backend() == dist.Backend.NCCL
    )

    def make(bn: nn.BatchNorm2d) -> nn.Module:
        cls = nn.SyncBatchNorm if use_torch_sync else GroupNaiveSyncBatchNorm
        return cls(
            bn.num_features,
            eps=bn.eps,
            momentum=bn.momentum,
            affine=bn.affine,
            track_running_stats=bn.track_running_stats,
            process_group=process_group,
        )

    return make


def convert_sync_batchnorm(
    model: nn.Module,
    scope: str,
    process_group=None,
    factory: Callable[[nn.BatchNorm2d], nn.Module] | None = None,
) -> list[str]:
    """Replace the BatchNorm2d layers in ``scope`` by synchronized BN, in place.

    ``torch.nn.SyncBatchNorm`` on CUDA with NCCL, :class:`GroupNaiveSyncBatchNorm` otherwise.
    detectron2's FrozenBatchNorm2d (frozen stages) is not a BatchNorm2d and stays frozen.
    Returns the module paths (relative to ``model``) of the converted layers.
    """
    root = sync_bn_root(model, scope)
    if root is None:
        return []
    make = factory or _default_factory(process_group)
    converted: list[str] = []
    names = {id(m): n for n, m in getattr(model, "module", model).named_modules()}
    for parent in list(root.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.BatchNorm2d) and not isinstance(child, NaiveSyncBatchNorm):
                new = make(child)
                new.load_state_dict(child.state_dict())
                if child.affine:
                    new.weight.requires_grad_(child.weight.requires_grad)
                    new.bias.requires_grad_(child.bias.requires_grad)
                new.train(child.training)
                new.to(child.running_mean.device if child.running_mean is not None else "cpu")
                setattr(parent, child_name, new)
                prefix = names.get(id(parent), "")
                converted.append(f"{prefix}.{child_name}" if prefix else child_name)
    return converted
