"""What each worker process runs for `megdet train` and `megdet eval`.

The worker claims the output folder (``ownership.claim_output_folder``: the run stamp), plans
the run from the world it finds (``plan_config``), registers the datasets,
writes ``config.yaml`` and ``plan.json``, builds the trainer (:func:`build_trainer`) and trains,
resuming from the last complete checkpoint in the output folder.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from detectron2.config import CfgNode
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng
from detectron2.utils.logger import setup_logger

from megdet.plan import Plan
from megdet.trainer.config import ConfigError, plan_config
from megdet.trainer.data import DatasetError, register_coco_dataset
from megdet.trainer.elastic import (
    PLAN_FILE,
    RunState,
    change_line,
    find_resume_point,
    resolve_legacy,
)
from megdet.trainer.engine import (
    EXIT_INTERRUPTED,
    NonFiniteLossError,
    TrainingInterrupted,
    build_trainer,
)
from megdet.trainer.evaluation import evaluate_model, write_metrics
from megdet.trainer.metrics import build_monitoring_hooks
from megdet.trainer.ownership import claim_output_folder
from megdet.trainer.progress_reporter import build_progress_hook

logger = logging.getLogger("megdet.trainer")

TRAIN_DATASET = "megdet_train"
VAL_DATASET = "megdet_val"
EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


@dataclass
class WorkerTask:
    """What one ``megdet train`` or ``megdet eval`` asks of each worker process: everything a
    worker needs, picklable for spawned processes (:func:`megdet.trainer.workers.run_workers`)."""

    cfg: CfgNode
    resume: bool = True
    command: str = "train"
    weights: str = ""


def setup_logging(output_dir: str) -> None:
    """detectron2's loggers (and ours) to stdout on rank 0 and to log.txt in the output folder."""
    rank = comm.get_rank()
    for name, abbrev in (("detectron2", "d2"), ("fvcore", None), ("megdet", None)):
        setup_logger(output_dir, distributed_rank=rank, name=name, abbrev_name=abbrev)


def register_datasets(cfg: CfgNode) -> None:
    """Register MEGDET.DATA's COCO files and point DATASETS.TRAIN / TEST at them."""
    data = cfg.MEGDET.DATA
    cfg.defrost()
    if data.TRAIN_JSON:
        register_coco_dataset(TRAIN_DATASET, data.TRAIN_JSON, data.TRAIN_IMAGES)
        cfg.DATASETS.TRAIN = (TRAIN_DATASET,)
    if data.VAL_JSON:
        register_coco_dataset(VAL_DATASET, data.VAL_JSON, data.VAL_IMAGES)
        cfg.DATASETS.TEST = (VAL_DATASET,)


def _save_run_files(cfg: CfgNode, run_state: RunState) -> None:
    out = Path(cfg.OUTPUT_DIR)
    (out / "config.yaml").write_text(cfg.dump())
    (out / PLAN_FILE).write_text(json.dumps(run_state.plan_file(), indent=2) + "\n")


def _print_plan(cfg: CfgNode, plan: Plan) -> None:
    summary = plan.summary()
    lines = [f"  {k}: {v}" for k, v in summary.items()]
    logger.info("Plan for the world this run found:\n%s", "\n".join(lines))
    logger.info("Effective config:\n%s", cfg.dump())


def _report_error(task: WorkerTask, err: Exception) -> int:
    if comm.get_local_rank() == 0:
        print(f"megdet {task.command}: error: {err}", file=sys.stderr, flush=True)
    return EXIT_BAD_INPUT


def train_worker(task: WorkerTask) -> int:
    """Train in this process (one rank of the world). Returns the exit code."""
    try:
        return _train(task)
    except (ConfigError, DatasetError) as err:
        return _report_error(task, err)
    except NonFiniteLossError as err:
        logger.error("%s", err)
        return EXIT_FAILED


def _train(task: WorkerTask) -> int:
    cfg = task.cfg.clone()
    Path(cfg.OUTPUT_DIR).mkdir(parents=True, exist_ok=True)
    # Before anything is written into the folder (log.txt included): is it this run's?
    claimed = claim_output_folder(cfg.OUTPUT_DIR, cfg.MEGDET.RESUME_FROM)
    setup_logging(cfg.OUTPUT_DIR)
    if comm.is_main_process():
        logger.info("%s", claimed)
    world, local = comm.get_world_size(), comm.get_local_size()
    # Where the run is (its newest checkpoint, read once), then the plan for the rest of it on
    # this world: the schedule stays in images seen whatever world saved the checkpoint.
    point = find_resume_point(cfg.OUTPUT_DIR) if task.resume else None
    if point is None:
        plan = plan_config(cfg, world, local)
    else:
        resolve_legacy(point, plan_config(cfg.clone(), world, local))
        plan = plan_config(cfg, world, local, point.images_done, point.run_batch)
        if comm.is_main_process():
            logger.info("%s", change_line(point, plan))
            if point.derived:
                logger.warning(
                    "%s holds no run state (an older trainer's): its images are its iterations "
                    "at the global batch %d (%s)",
                    point.path,
                    point.run_batch,
                    point.derived,
                )
    # Rank 0 reports the loading stage now, before the model, the data and the checkpoint.
    progress = build_progress_hook(plan)
    if progress is not None:
        progress.loading()
    register_datasets(cfg)
    if cfg.SEED >= 0:
        # Like detectron2's default_setup: Python, NumPy and torch. The train sampler draws its
        # shuffle seed from NumPy, so with SEED set the data order repeats too.
        seed_all_rng(cfg.SEED + comm.get_rank())
    else:
        torch.manual_seed(comm.get_rank())
    if comm.is_main_process():
        _print_plan(cfg, plan)
    cfg.freeze()

    bundle = None

    def evaluate(model: torch.nn.Module) -> dict[str, Any]:
        if progress is not None:
            progress.evaluating()
        results = evaluate_model(cfg, model, cfg.DATASETS.TEST[0])
        if comm.is_main_process():
            write_metrics(
                cfg.OUTPUT_DIR,
                results,
                # Iterations completed: iter is 0-based in a step, max_iter after training.
                iteration=min(bundle.trainer.iter + 1, plan.max_iter) if bundle else None,
                dataset=cfg.MEGDET.DATA.VAL_JSON or cfg.DATASETS.TEST[0],
                world_size=world,
            )
        return results

    bundle = build_trainer(
        cfg, plan, evaluate if cfg.DATASETS.TEST else None, resume=task.resume, point=point
    )
    if comm.is_main_process():
        _save_run_files(cfg, bundle.run_state)
    # After build_trainer: the hooks need its checkpointer and model, and run after its hooks.
    bundle.trainer.register_hooks(build_monitoring_hooks(cfg, plan, bundle, progress))
    if comm.is_main_process():
        logger.info(
            "SyncBN scope %r: %d BatchNorm layers synchronized (BN group size %s)",
            cfg.MEGDET.SYNC_BN,
            len(bundle.sync_bn_layers),
            cfg.MEGDET.BN_GROUP_SIZE or world,
        )
    try:
        bundle.trainer.train(bundle.start_iter, plan.max_iter)
    except TrainingInterrupted:
        return EXIT_INTERRUPTED
    return 0


def eval_worker(task: WorkerTask) -> int:
    """Evaluate ``task.weights`` on MEGDET.DATA.VAL_* and write metrics.json."""
    try:
        return _eval(task)
    except (ConfigError, DatasetError) as err:
        return _report_error(task, err)


def _eval(task: WorkerTask) -> int:
    from megdet.trainer.checkpoint import AtomicCheckpointer
    from megdet.trainer.engine import build_megdet_model, weights_trusted

    cfg = task.cfg.clone()
    Path(cfg.OUTPUT_DIR).mkdir(parents=True, exist_ok=True)
    setup_logging(cfg.OUTPUT_DIR)
    register_datasets(cfg)
    if not cfg.DATASETS.TEST:
        raise ConfigError("MEGDET.DATA.VAL_JSON: required for evaluation (or --val-json)")
    cfg.freeze()
    model, _ = build_megdet_model(cfg)
    if not Path(task.weights).is_file():
        raise ConfigError(f"--weights: {task.weights} does not exist")
    AtomicCheckpointer(model, save_dir=cfg.OUTPUT_DIR).load_weights(
        task.weights, key="--weights", trusted=weights_trusted(cfg, task.weights)
    )
    results = evaluate_model(cfg, model, cfg.DATASETS.TEST[0])
    if comm.is_main_process():
        path = write_metrics(
            cfg.OUTPUT_DIR, results, weights=task.weights, dataset=cfg.MEGDET.DATA.VAL_JSON
        )
        logger.info("Wrote %s", path)
    return 0
