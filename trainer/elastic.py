"""A run that resumes on any number of workers and still trains like a fixed run.

Every checkpoint the trainer writes holds the run's state under :data:`RUN_STATE_KEY`: the
images seen when it was saved, the global batch the run started with (what keep-batch keeps),
the data sampler's seed and the run's segments (one per world the run trained on). On resume
:func:`find_resume_point` reads the newest readable checkpoint once; the worker re-plans from
the world it finds and those images (:func:`megdet.plan.plan_continuation`, through
``plan_config``), so the iteration counter, the learning rate and its milestones, the
accumulation and the sampler's position are derived for the new world, not restored from the
old one. A checkpoint written before this state existed is read by its ``iteration`` and the
``plan.json`` beside it.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from detectron2.data.samplers import TrainingSampler

from megdet.plan import Plan
from megdet.trainer.checkpoint import RUN_STATE_KEY, AtomicCheckpointer
from megdet.trainer.report import PLAN_FILE

logger = logging.getLogger(__name__)


@dataclass
class ResumePoint:
    """The checkpoint a worker resumes from, read once, and what the run had done by then."""

    path: Path
    checkpoint: dict[str, Any]
    iteration: int  # the last iteration the checkpoint completed, in its own segment's count
    images_done: int
    run_batch: int
    segments: list[dict[str, Any]] = field(default_factory=list)
    sampler_seed: int | None = None
    #: How the images were found for a checkpoint without the run state ("" when it had it).
    derived: str = ""


def find_resume_point(output_dir: str | os.PathLike) -> ResumePoint | None:
    """The newest readable checkpoint in ``output_dir`` and the run's state in it; None if there
    is none. Raises UnsafeCheckpointError for a checkpoint this trainer did not write."""
    found = AtomicCheckpointer(torch.nn.Module(), save_dir=str(output_dir)).read_latest()
    return None if found is None else _resume_point(*found)


def _resume_point(path: Path, data: dict[str, Any]) -> ResumePoint:
    iteration = int(data.get("iteration", -1))
    state = data.get(RUN_STATE_KEY)
    if isinstance(state, dict) and "images_seen" in state:
        return ResumePoint(
            path,
            data,
            iteration,
            int(state["images_seen"]),
            int(state["run_batch"]),
            [dict(s) for s in state.get("segments", [])],
            state.get("sampler_seed"),
        )
    # A checkpoint from before the run state: its iterations were at the batch of plan.json.
    batch, source = None, "the plan.json beside it"
    try:
        batch = int(json.loads((path.parent / PLAN_FILE).read_text())["global_batch"])
    except (OSError, ValueError, KeyError, TypeError):
        source = "no plan.json: assumed to be this world's batch"
    return ResumePoint(path, data, iteration, -1, batch or -1, derived=source)


def resolve_legacy(point: ResumePoint, plan: Plan) -> None:
    """Fill in a pre-state checkpoint's images from this world's plan when plan.json is gone."""
    if point.run_batch < 1:
        point.run_batch = plan.global_batch
    if point.images_done < 0:
        point.images_done = (point.iteration + 1) * point.run_batch


def segment_of(plan: Plan) -> dict[str, Any]:
    """A segment as planned: the world, batch and LR it trains at, and where it starts and ends."""
    return {
        "world_size": plan.world_size,
        "global_batch": plan.global_batch,
        "accumulation_steps": plan.spec.accumulation_steps,
        "lr": plan.lr,
        "resize": plan.resize.value if plan.resize else None,
        "first_iter": plan.start_iter,
        "last_iter": plan.max_iter - 1,
        "images_start": plan.images_done,
        "images_end": plan.images_seen,
    }


class RunState:
    """The run's segments and what each checkpoint records of them (:meth:`at`)."""

    def __init__(self, plan: Plan, point: ResumePoint | None, sampler_seed: int | None) -> None:
        self.plan = plan
        self.run_batch = point.run_batch if point else plan.global_batch
        self.sampler_seed = sampler_seed
        self.segments = list(point.segments) if point else []
        if point is not None and not self.segments:
            # The run before the state existed: one segment up to the checkpoint.
            self.segments.append(
                {
                    "world_size": None,
                    "global_batch": point.run_batch,
                    "first_iter": 0,
                    "last_iter": point.iteration,
                    "images_start": 0,
                    "images_end": point.images_done,
                }
            )
        if point is None or plan.max_iter > plan.start_iter:
            # A finished run started again only re-evaluates: no segment for it.
            self.segments.append(segment_of(plan))

    def at(self, iteration: int) -> dict[str, Any]:
        """The state to save with the checkpoint of ``iteration`` (its last completed one)."""
        segments = [dict(s) for s in self.segments]
        if segments[-1]["images_start"] == self.plan.images_done:  # this world's segment
            segments[-1].update(last_iter=iteration, images_end=self.plan.images_at(iteration + 1))
        return {
            "images_seen": self.plan.images_at(iteration + 1),
            "run_batch": self.run_batch,
            "sampler_seed": self.sampler_seed,
            "segments": segments,
        }

    def plan_file(self) -> dict[str, Any]:
        """plan.json: this segment's plan, and every segment of the run (the last as planned)."""
        return {**self.plan.summary(), "segments": self.segments}


def change_line(point: ResumePoint, plan: Plan) -> str:
    """The one log line that says what a resume changed, and why."""
    before = point.segments[-1] if point.segments else {"global_batch": point.run_batch}
    world = before.get("world_size")
    if world == plan.world_size and before["global_batch"] == plan.global_batch:
        return (
            f"Resuming after {point.images_done:,} images on the same {world} workers: global "
            f"batch {plan.global_batch}, lr {plan.lr:.6g}, iteration {plan.start_iter} of "
            f"{plan.max_iter}"
        )
    was = f"{world} workers" if world else "the run before"
    lr = f", lr {before['lr']:.6g}" if "lr" in before else ""
    return (
        f"Resuming after {point.images_done:,} images on {plan.world_size} workers (was {was}: "
        f"global batch {before['global_batch']}{lr}): global batch {plan.global_batch}, "
        f"lr {plan.lr:.6g}, {plan.spec.accumulation_steps} accumulation step(s), iteration "
        f"{plan.start_iter} of {plan.max_iter}, LR steps {list(plan.steps)}; "
        f"{plan.resize_reason or 'same world'}"
    )


class ResumableTrainingSampler(TrainingSampler):
    """detectron2's TrainingSampler that starts ``skip`` indices into its stream.

    The stream (seeded permutations of the dataset) does not depend on the world: rank ``r`` of
    ``w`` takes indices ``skip + r, skip + r + w, ...``, so micro-batch after micro-batch the
    world consumes consecutive runs of the same stream whatever its size, and a run resumed
    after ``skip`` images continues where it stopped (without aspect-ratio grouping, exactly).
    """

    def __init__(self, size: int, seed: int | None, skip: int) -> None:
        super().__init__(size, shuffle=True, seed=seed)
        self._skip = skip

    @property
    def seed(self) -> int:
        return self._seed

    def __iter__(self) -> Iterator[int]:
        yield from itertools.islice(
            self._stream_from(self._skip), self._rank, None, self._world_size
        )

    def _stream_from(self, skip: int) -> Iterator[int]:
        g = torch.Generator()
        g.manual_seed(self._seed)
        for _ in range(skip // self._size):  # whole permutations: drawn, not iterated
            torch.randperm(self._size, generator=g)
        first = torch.randperm(self._size, generator=g).tolist()[skip % self._size :]
        yield from first
        while True:
            yield from torch.randperm(self._size, generator=g).tolist()
