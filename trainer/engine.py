"""The training loop and its hooks: accumulation, AMP, non-finite loss, SIGTERM, checkpoints.

:class:`MegDetTrainer` is detectron2's ``SimpleTrainer`` with a ``run_step`` that accumulates
micro-batches; everything else (LR schedule, checkpoints, evaluation, writers, stopping on
SIGTERM) is a hook. :func:`build_trainer` assembles a ready-to-train trainer from a planned
config without any CLI, so benchmarks and tests can build exactly what ``megdet train`` runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import traceback
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from detectron2.config import CfgNode
from detectron2.data import build_detection_train_loader
from detectron2.data.build import _train_loader_from_config
from detectron2.data.samplers import TrainingSampler
from detectron2.engine import SimpleTrainer, hooks
from detectron2.modeling import build_model
from detectron2.solver import build_optimizer
from detectron2.utils import comm
from detectron2.utils.events import CommonMetricPrinter, EventWriter, JSONWriter
from torch.nn.parallel import DistributedDataParallel

from megdet.plan import Plan
from megdet.trainer.checkpoint import AtomicCheckpointer
from megdet.trainer.config import TRUSTED_WEIGHTS, ConfigError
from megdet.trainer.elastic import (
    ResumableTrainingSampler,
    ResumePoint,
    RunState,
    find_resume_point,
)
from megdet.trainer.report import EVENTS_FILE
from megdet.trainer.solver import PlanParamScheduler
from megdet.trainer.sync_bn import build_bn_process_group, convert_sync_batchnorm

logger = logging.getLogger(__name__)

#: Exit code after a SIGTERM: the checkpoint is saved, but the run is not finished (128 + 15).
EXIT_INTERRUPTED = 128 + signal.SIGTERM


class TrainingInterrupted(BaseException):
    """Raised by :class:`StopOnSignal` after it saved a checkpoint; not an error of the run.

    A BaseException (like KeyboardInterrupt) so detectron2's loop does not log it as a failure.
    """


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; the message names the iteration and the components."""


class MegDetTrainer(SimpleTrainer):
    """SimpleTrainer that accumulates ``accumulation_steps`` micro-batches per optimizer step.

    Each micro-batch runs forward and backward on its own (synchronized BN therefore
    synchronizes every micro-batch); the loss is divided by the number of micro-batches so the
    step equals one big batch; DDP's gradient all-reduce runs only on the last micro-batch.
    With ``grad_scaler`` (CUDA AMP) the forward runs under autocast and the loss is scaled.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        data_loader,
        optimizer: torch.optim.Optimizer,
        accumulation_steps: int = 1,
        grad_scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        super().__init__(model, data_loader, optimizer)
        self.accumulation_steps = accumulation_steps
        self.grad_scaler = grad_scaler
        #: This rank's data-loading seconds in the last step (detectron2's storage keeps only
        #: the maximum over ranks, on rank 0); read by the metrics exporter.
        self.data_time: float | None = None
        #: The NonFiniteLossError that stopped the run, for hooks' after_train (run history).
        self.nonfinite_error: NonFiniteLossError | None = None

    def run_step(self) -> None:
        assert self.model.training, "[MegDetTrainer] model was changed to eval mode!"
        steps = self.accumulation_steps
        self.optimizer.zero_grad(set_to_none=True)
        data_time = 0.0
        summed: dict[str, torch.Tensor] = {}
        for micro in range(steps):
            start = time.perf_counter()
            data = next(self._data_loader_iter)
            data_time += time.perf_counter() - start
            last = micro == steps - 1
            with self._grad_sync(last), self._autocast():
                loss_dict = self.model(data)
                losses = sum(loss_dict.values())
                self._check_finite(losses, loss_dict)
                scaled = losses / steps
                if self.grad_scaler is not None:
                    scaled = self.grad_scaler.scale(scaled)
                scaled.backward()
            for k, v in loss_dict.items():
                summed[k] = summed.get(k, 0) + v.detach() / steps
        self.after_backward()
        self.data_time = data_time
        self._write_metrics(summed, data_time)
        if self.grad_scaler is not None:
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            self.optimizer.step()

    def _grad_sync(self, last: bool):
        if not last and isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def _autocast(self):
        if self.grad_scaler is None:
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=torch.float16)

    def _check_finite(self, losses: torch.Tensor, loss_dict: dict[str, torch.Tensor]) -> None:
        if torch.isfinite(losses).item():
            return
        parts = ", ".join(f"{k}={v.item():.4g}" for k, v in loss_dict.items())
        self.nonfinite_error = NonFiniteLossError(
            f"non-finite loss at iteration {self.iter} on rank {comm.get_rank()}: {parts}. "
            "Lower SOLVER.BASE_LR, lengthen SOLVER.WARMUP_ITERS or enable "
            "SOLVER.CLIP_GRADIENTS."
        )
        raise self.nonfinite_error

    def state_dict(self) -> dict[str, Any]:
        ret = super().state_dict()
        if self.grad_scaler is not None:
            ret["grad_scaler"] = self.grad_scaler.state_dict()
        return ret

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if self.grad_scaler is not None and "grad_scaler" in state_dict:
            self.grad_scaler.load_state_dict(state_dict["grad_scaler"])


class StopOnSignal(hooks.HookBase):
    """On SIGTERM: finish the current step, save a checkpoint, stop every rank together.

    The signal may reach one rank or all; after each step the ranks agree (one tiny all-reduce
    over a gloo group) so they stop at the same iteration.
    """

    def __init__(self, checkpointer: AtomicCheckpointer, signals=(signal.SIGTERM,)) -> None:
        self._checkpointer = checkpointer
        self._signals = signals
        self._requested = False
        self._previous: dict[int, Any] = {}
        self._group = None

    def _handler(self, signum, frame) -> None:
        logger.warning("Received signal %d: stopping after this iteration", signum)
        self._requested = True

    def before_train(self) -> None:
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handler)
        if comm.get_world_size() > 1:
            self._group = dist.new_group(backend="gloo")

    def after_train(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

    def after_step(self) -> None:
        if not self._stop_agreed():
            return
        iteration = self.trainer.iter
        self._checkpointer.save(f"model_{iteration:07d}", iteration=iteration)
        comm.synchronize()
        logger.warning("Saved a checkpoint at iteration %d after SIGTERM; exiting", iteration)
        raise TrainingInterrupted(iteration)

    def _stop_agreed(self) -> bool:
        if self._group is None:
            return self._requested
        flag = torch.tensor([int(self._requested)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return bool(flag.item())


def build_writers(cfg: CfgNode, max_iter: int) -> list[EventWriter]:
    """The event writers of rank 0. A metrics exporter (e.g. Prometheus) is one more writer."""
    return [
        CommonMetricPrinter(max_iter),
        JSONWriter(os.path.join(cfg.OUTPUT_DIR, EVENTS_FILE)),
    ]


def build_megdet_model(cfg: CfgNode, process_group=None) -> tuple[torch.nn.Module, list[str]]:
    """detectron2's ``build_model`` plus synchronized BN in the configured scope.

    BN layers are converted only when there is more than one process to synchronize with.
    Returns the model (not yet DDP-wrapped) and the module paths of the converted layers.
    A config that detectron2's builders refuse (their asserts on a combination of MODEL keys,
    a registry without the named component, a value of the wrong kind) is a
    :class:`ConfigError` with detectron2's own words, which name the key; an assert without
    words is named by its source line and place (``assert len(self._out_features)``).
    """
    try:
        model = build_model(cfg)
    except (AssertionError, KeyError, ValueError, TypeError) as err:
        raise ConfigError(f"MODEL: detectron2 cannot build this model: {_refusal(err)}") from err
    converted: list[str] = []
    if comm.get_world_size() > 1:
        converted = convert_sync_batchnorm(model, cfg.MEGDET.SYNC_BN, process_group=process_group)
    return model, converted


def _refusal(err: BaseException) -> str:
    """What a builder's exception says, or, when it says nothing, the line that raised it."""
    said = str(err.args[0]) if len(err.args) == 1 else str(err)
    if said:
        return said
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return type(err).__name__
    where = frames[-1]
    return f"{type(err).__name__} at {where.filename}:{where.lineno}: {where.line}"


def wrap_ddp(model: torch.nn.Module) -> torch.nn.Module:
    """DDP over the world (no device_ids on CPU, where DDP refuses them)."""
    if comm.get_world_size() == 1:
        return model
    on_cuda = next(model.parameters()).is_cuda
    return DistributedDataParallel(
        model,
        device_ids=[comm.get_local_rank()] if on_cuda else None,
        # BN statistics are synchronized (or kept local) by design, never broadcast per step.
        forward_sync_buffers=False,
    )


def weights_trusted(cfg: CfgNode, path: str) -> bool:
    """Whether the weights file ``path`` may be loaded with detectron2's unsafe loaders."""
    return bool(cfg.MEGDET.ALLOW_UNSAFE_WEIGHTS) or path in TRUSTED_WEIGHTS


@dataclass
class TrainerBundle:
    """What :func:`build_trainer` makes: the trainer and the parts hooks and callers need."""

    trainer: MegDetTrainer
    checkpointer: AtomicCheckpointer
    model: torch.nn.Module
    sync_bn_layers: list[str]
    run_state: RunState
    start_iter: int = 0


def build_train_loader(cfg: CfgNode, point: ResumePoint | None):
    """detectron2's train loader of one micro-batch per rank, and the sampler's seed.

    detectron2's TrainingSampler is replaced by one that starts where the run stopped, in the
    same seeded stream (:class:`ResumableTrainingSampler`); other samplers start over.
    """
    kwargs = _train_loader_from_config(cfg)
    kwargs["total_batch_size"] = cfg.MEGDET.IMAGES_PER_GPU * comm.get_world_size()
    sampler = kwargs["sampler"]
    seed = None
    if type(sampler) is TrainingSampler:
        seed = sampler._seed  # detectron2's choice for a new run (shared by every rank)
        if point is not None and point.sampler_seed is not None:
            seed = int(point.sampler_seed)
        skip = point.images_done if point is not None else 0
        kwargs["sampler"] = ResumableTrainingSampler(len(kwargs["dataset"]), seed, skip)
    elif point is not None:
        logger.info("%s starts its stream over on resume", type(sampler).__name__)
    return build_detection_train_loader(**kwargs), seed


def build_trainer(
    cfg: CfgNode,
    plan: Plan,
    evaluate=None,
    extra_hooks: list[hooks.HookBase] | None = None,
    resume: bool = True,
    point: ResumePoint | None = None,
) -> TrainerBundle:
    """A trainer for a planned config: model (+SyncBN, DDP), optimizer, loader, hooks, resume.

    ``evaluate(model) -> dict`` runs at ``TEST.EVAL_PERIOD`` and after the last iteration;
    ``extra_hooks`` run after the built-in ones (e.g. an exporter). With ``resume``, the
    newest checkpoint (``point``, or the one found in the output folder) is loaded; a plan made
    for it (``plan_config`` with its images) says where to start, and the optimizer keeps the
    plan's learning rate, not the checkpoint's.
    """
    os.makedirs(cfg.OUTPUT_DIR, exist_ok=True)
    bn_group = build_bn_process_group(cfg.MEGDET.BN_GROUP_SIZE)
    model, converted = build_megdet_model(cfg, bn_group)
    optimizer = build_optimizer(cfg, model)
    model = wrap_ddp(model)
    if point is None and resume:
        point = find_resume_point(cfg.OUTPUT_DIR)
    loader, seed = build_train_loader(cfg, point if resume else None)
    scaler = torch.amp.GradScaler("cuda") if cfg.MEGDET.AMP else None
    trainer = MegDetTrainer(model, loader, optimizer, cfg.MEGDET.ACCUMULATION_STEPS, scaler)
    checkpointer = AtomicCheckpointer(model, cfg.OUTPUT_DIR, trainer=weakref.proxy(trainer))
    run_state = RunState(plan, point if resume else None, seed)
    checkpointer.run_state = run_state.at

    hook_list: list[hooks.HookBase] = [
        hooks.IterationTimer(),
        hooks.LRScheduler(optimizer, PlanParamScheduler(plan)),
    ]
    if comm.is_main_process():
        hook_list.append(hooks.PeriodicCheckpointer(checkpointer, cfg.SOLVER.CHECKPOINT_PERIOD))
    if evaluate is not None:
        hook_list.append(hooks.EvalHook(cfg.TEST.EVAL_PERIOD, lambda: evaluate(model)))
    if comm.is_main_process():
        hook_list.append(hooks.PeriodicWriter(build_writers(cfg, plan.max_iter), period=20))
    hook_list.append(StopOnSignal(checkpointer))
    hook_list.extend(extra_hooks or [])
    trainer.register_hooks(hook_list)

    start_iter = 0
    if resume and point is not None:
        planned = [group["lr"] for group in optimizer.param_groups]
        logger.info("Resuming from %s", point.path)
        checkpointer.load_read(point.path, point.checkpoint)
        # The checkpoint's param groups carry the learning rate of the world that saved it;
        # the scheduler multiplies initial_lr: both are this plan's.
        for group, lr in zip(optimizer.param_groups, planned, strict=True):
            group["lr"] = group["initial_lr"] = lr
        start_iter = plan.start_iter if plan.images_done else point.iteration + 1
    if start_iter == 0 and cfg.MODEL.WEIGHTS:
        weights = cfg.MODEL.WEIGHTS
        checkpointer.load_weights(weights, trusted=weights_trusted(cfg, weights))
    return TrainerBundle(trainer, checkpointer, model, converted, run_state, start_iter)
