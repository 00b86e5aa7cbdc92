"""Synchronized BN: equivalence with one big batch, BN groups, and conversion by scope."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from trainer_dist import run_distributed

N_PER_RANK, C, H, W = 3, 5, 6, 7


def _problem(world: int):
    """Input, upstream gradient and BN parameters, identical in every process."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(world * N_PER_RANK, C, H, W, generator=g) * 3 + 1
    upstream = torch.randn(x.shape, generator=g)
    weight = torch.rand(C, generator=g) + 0.5
    bias = torch.randn(C, generator=g)
    return x, upstream, weight, bias


def _reference(x, upstream, weight, bias):
    bn = nn.BatchNorm2d(C)
    with torch.no_grad():
        bn.weight.copy_(weight)
        bn.bias.copy_(bias)
    x = x.clone().requires_grad_(True)
    out = bn(x)
    (out * upstream).sum().backward()
    return out.detach(), x.grad, bn.running_mean, bn.running_var, bn.weight.grad


def _sync_bn_worker(rank: int, world: int, out_dir: str, group_size: int) -> None:
    from megdet.trainer.sync_bn import GroupNaiveSyncBatchNorm, build_bn_process_group

    group = build_bn_process_group(group_size)
    x, upstream, weight, bias = _problem(world)
    bn = GroupNaiveSyncBatchNorm(C, process_group=group)
    with torch.no_grad():
        bn.weight.copy_(weight)
        bn.bias.copy_(bias)
    rows = slice(rank * N_PER_RANK, (rank + 1) * N_PER_RANK)
    local = x[rows].clone().requires_grad_(True)
    out = bn(local)
    (out * upstream[rows]).sum().backward()
    torch.save(
        {
            "out": out.detach(),
            "grad": local.grad,
            "mean": bn.running_mean,
            "var": bn.running_var,
            "wgrad": bn.weight.grad,
        },
        f"{out_dir}/rank{rank}.pt",
    )


@pytest.mark.slow
def test_sync_bn_on_two_gloo_processes_equals_one_process_on_the_concatenated_batch(tmp_path):
    run_distributed(2, _sync_bn_worker, str(tmp_path), 0)
    x, upstream, weight, bias = _problem(2)
    out, grad, mean, var, wgrad = _reference(x, upstream, weight, bias)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    torch.testing.assert_close(torch.cat([r["out"] for r in ranks]), out, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat([r["grad"] for r in ranks]), grad, atol=1e-5, rtol=0)
    for r in ranks:
        torch.testing.assert_close(r["mean"], mean, atol=1e-5, rtol=0)
        torch.testing.assert_close(r["var"], var, atol=1e-5, rtol=0)
    # DDP sums (averages) the per-rank parameter gradients: their sum is the big-batch gradient.
    torch.testing.assert_close(ranks[0]["wgrad"] + ranks[1]["wgrad"], wgrad, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_bn_groups_synchronize_within_each_group_only(tmp_path):
    run_distributed(4, _sync_bn_worker, str(tmp_path), 2)
    x, upstream, weight, bias = _problem(4)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    for first in (0, 2):
        rows = slice(first * N_PER_RANK, (first + 2) * N_PER_RANK)
        out, grad, mean, var, _ = _reference(x[rows], upstream[rows], weight, bias)
        pair = ranks[first : first + 2]
        torch.testing.assert_close(torch.cat([r["out"] for r in pair]), out, atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.cat([r["grad"] for r in pair]), grad, atol=1e-5, rtol=0)
        for r in pair:
            torch.testing.assert_close(r["mean"], mean, atol=1e-5, rtol=0)
            torch.testing.assert_close(r["var"], var, atol=1e-5, rtol=0)
    # And the groups really differ from whole-world statistics.
    whole = _reference(x, upstream, weight, bias)
    assert not torch.allclose(ranks[0]["mean"], whole[2], atol=1e-3)


def _normed_tiny_model():
    """The tiny model with a BN in the FPN and the box head too, and frozen early stages."""
    from detectron2.modeling import build_model

    from megdet.trainer.config import load_config

    cfg = load_config(
        "megdet_tiny_cpu.yaml",
        [
            "MODEL.BACKBONE.FREEZE_AT", "2",
            "MODEL.FPN.NORM", "BN",
            "MODEL.ROI_BOX_HEAD.NUM_CONV", "2",
            "MODEL.ROI_BOX_HEAD.CONV_DIM", "32",
            "MODEL.ROI_BOX_HEAD.NORM", "BN",
        ],
    )  # fmt: skip
    return build_model(cfg)


def _paths(model, kind) -> set[str]:
    return {name for name, m in model.named_modules() if type(m) is kind}


@pytest.mark.parametrize("scope", ["backbone", "all", "none"])
def test_scope_converts_exactly_the_bn_layers_it_names(scope):
    from detectron2.layers import FrozenBatchNorm2d

    from megdet.trainer.sync_bn import GroupNaiveSyncBatchNorm, convert_sync_batchnorm

    model = _normed_tiny_model()
    bn = _paths(model, nn.BatchNorm2d)
    frozen = _paths(model, FrozenBatchNorm2d)
    in_backbone = {p for p in bn if p.startswith("backbone.bottom_up.")}
    assert in_backbone and bn - in_backbone and frozen  # the model has all three kinds
    before = {k: v.clone() for k, v in model.state_dict().items()}

    converted = set(convert_sync_batchnorm(model, scope))

    expected = {"backbone": in_backbone, "all": bn, "none": set()}[scope]
    assert converted == expected
    assert _paths(model, GroupNaiveSyncBatchNorm) == expected
    assert _paths(model, nn.BatchNorm2d) == bn - expected
    assert _paths(model, FrozenBatchNorm2d) == frozen  # frozen stages stay frozen
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
