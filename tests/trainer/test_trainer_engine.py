"""The training step: gradient accumulation, DDP no_sync, non-finite loss, the LR curve."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from trainer_dist import run_distributed

MICRO_BATCH, FEATURES, ACCUMULATION = 4, 6, 3


class _Regression(nn.Module):
    """A BN-free model with detectron2's interface: a batch in, a dict of losses out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, batch):
        x, y = batch
        return {"loss_mse": ((self.body(x) - y) ** 2).mean()}


def _global_batch(world: int):
    g = torch.Generator().manual_seed(1)
    n = world * ACCUMULATION * MICRO_BATCH
    return torch.randn(n, FEATURES, generator=g), torch.randn(n, 1, generator=g)


def _big_batch_grads(world: int) -> list[torch.Tensor]:
    model = _Regression()
    model(_global_batch(world))["loss_mse"].backward()
    return [p.grad for p in model.parameters()]


def _accumulation_worker(rank: int, world: int, out_dir: str) -> None:
    from detectron2.utils.events import EventStorage
    from torch.nn.parallel import DistributedDataParallel

    from megdet.trainer.engine import MegDetTrainer

    x, y = _global_batch(world)
    start = rank * ACCUMULATION * MICRO_BATCH
    micro = [
        (x[i : i + MICRO_BATCH], y[i : i + MICRO_BATCH])
        for i in range(start, start + ACCUMULATION * MICRO_BATCH, MICRO_BATCH)
    ]
    model = DistributedDataParallel(_Regression())
    allreduces = []

    def counting_hook(state, bucket):
        allreduces.append(bucket.index())
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # keep the gradients to compare
    trainer = MegDetTrainer(model, iter(micro), optimizer, accumulation_steps=ACCUMULATION)
    with EventStorage(0):
        trainer.iter = 0
        trainer.run_step()
    torch.save(
        {"grads": [p.grad for p in model.parameters()], "allreduces": allreduces},
        f"{out_dir}/rank{rank}.pt",
    )


@pytest.mark.slow
def test_accumulated_gradient_equals_the_big_batch_gradient_with_one_allreduce(tmp_path):
    run_distributed(2, _accumulation_worker, str(tmp_path))
    expected = _big_batch_grads(2)
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        for got, want in zip(result["grads"], expected, strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        # DDP all-reduced only on the last micro-batch (one bucket for this small model).
        assert result["allreduces"] == [0]


class _Exploding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, batch):
        return {"loss_cls": self.w.sum(), "loss_box_reg": self.w.sum() * float("inf")}


def test_non_finite_loss_stops_with_the_iteration_and_the_components():
    from detectron2.utils.events import EventStorage

    from megdet.trainer.engine import MegDetTrainer, NonFiniteLossError

    model = _Exploding()
    trainer = MegDetTrainer(model, iter([0, 0, 0]), torch.optim.SGD(model.parameters(), lr=0.1))
    with EventStorage(7), pytest.raises(NonFiniteLossError) as err:
        trainer.iter = 7
        trainer.run_step()
    message = str(err.value)
    assert "iteration 7" in message
    assert "loss_box_reg=inf" in message and "loss_cls=1" in message
    assert model.w.item() == 1.0  # no optimizer step with a broken loss


@pytest.mark.parametrize("schedule", ["step", "three-stage"])
def test_lr_scheduler_follows_the_plan_curve(schedule):
    from detectron2.solver.lr_scheduler import LRMultiplier

    from megdet.plan import plan_run
    from megdet.trainer.solver import PlanParamScheduler

    plan = plan_run(
        {"gpus": 4, "images_per_gpu": 2, "reference_batch": 16, "base_lr": 0.02,
         "max_iter": 400, "steps": (200, 300), "warmup_iters": 40, "schedule": schedule}
    )  # fmt: skip
    param = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=plan.lr)
    scheduler = LRMultiplier(optimizer, PlanParamScheduler(plan), plan.max_iter)
    seen = []
    for _ in range(plan.max_iter):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = [plan.lr_at(i) for i in range(plan.max_iter)]
    assert seen == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert max(seen) == pytest.approx(plan.lr, rel=0.05)  # the scaled peak (0.01 at batch 8)
