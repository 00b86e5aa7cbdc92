"""The run's state in a checkpoint, read back for a resume on another world, and the sampler that
continues the data stream where the run stopped (trainer/elastic.py), without training."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from detectron2.utils import comm

from megdet.plan import plan_continuation, plan_run
from megdet.trainer.checkpoint import RUN_STATE_KEY, AtomicCheckpointer
from megdet.trainer.elastic import (
    ResumableTrainingSampler,
    RunState,
    change_line,
    find_resume_point,
    resolve_legacy,
)

RECIPE = {"images_per_gpu": 4, "reference_batch": 8, "base_lr": 0.01, "max_iter": 40}
RECIPE |= {"steps": (30, 35), "warmup_iters": 10}


def _checkpointer(folder) -> AtomicCheckpointer:
    return AtomicCheckpointer(torch.nn.Linear(2, 1), save_dir=str(folder))


def test_each_checkpoint_holds_the_images_and_segments_and_a_resume_reads_them(tmp_path):
    two = plan_run({**RECIPE, "gpus": 2})
    state = RunState(two, None, sampler_seed=1234)
    ckpt = _checkpointer(tmp_path)
    ckpt.run_state = state.at
    ckpt.save("model_0000009", iteration=9)
    point = find_resume_point(tmp_path)
    assert (point.iteration, point.images_done, point.run_batch, point.sampler_seed) == (
        9, 80, 8, 1234
    )  # fmt: skip
    assert point.segments == [
        {"world_size": 2, "global_batch": 8, "accumulation_steps": 1, "lr": 0.01, "resize": None,
         "first_iter": 0, "last_iter": 9, "images_start": 0, "images_end": 80}
    ]  # fmt: skip
    # On one worker, the batch kept: the next segment starts at iteration 10 with 2 steps.
    one = plan_continuation({**RECIPE, "gpus": 1}, point.images_done, run_batch=point.run_batch)
    resumed = RunState(one, point, point.sampler_seed)
    ckpt.run_state = resumed.at
    ckpt.save("model_0000019", iteration=19)
    again = find_resume_point(tmp_path)
    assert again.images_done == 160 and [s["world_size"] for s in again.segments] == [2, 1]
    assert again.segments[1] | {} == {
        "world_size": 1, "global_batch": 8, "accumulation_steps": 2, "lr": 0.01,
        "resize": "keep-batch", "first_iter": 10, "last_iter": 19, "images_start": 80,
        "images_end": 160,
    }  # fmt: skip
    assert "on 1 workers (was 2 workers: global batch 8, lr 0.01): global batch 8" in (
        change_line(point, one)
    )
    same = plan_continuation({**RECIPE, "gpus": 1}, again.images_done, run_batch=8)
    assert change_line(again, same).startswith("Resuming after 160 images on the same 1 workers")
    plan_file = resumed.plan_file()
    assert plan_file["world_size"] == 1 and len(plan_file["segments"]) == 2
    json.dumps(plan_file)  # plain data


def test_a_checkpoint_from_before_the_run_state_is_read_by_its_iteration_and_plan_json(tmp_path):
    ckpt = _checkpointer(tmp_path)
    ckpt.save("model_0000009", iteration=9)  # no run_state: an older trainer's file
    (tmp_path / "plan.json").write_text(json.dumps(plan_run({**RECIPE, "gpus": 2}).summary()))
    point = find_resume_point(tmp_path)
    assert RUN_STATE_KEY not in point.checkpoint
    resolve_legacy(point, plan_run({**RECIPE, "gpus": 1}))
    assert (point.images_done, point.run_batch) == (80, 8)
    assert point.derived == "the plan.json beside it"
    (tmp_path / "plan.json").unlink()
    bare = find_resume_point(tmp_path)
    resolve_legacy(bare, plan_run({**RECIPE, "gpus": 1}))
    assert (bare.images_done, bare.run_batch) == (40, 4)  # this world's batch, as it says
    assert "assumed" in bare.derived


def test_a_finished_run_started_again_adds_no_segment(tmp_path):
    two = plan_run({**RECIPE, "gpus": 2})
    ckpt = _checkpointer(tmp_path)
    ckpt.run_state = RunState(two, None, None).at
    ckpt.save("model_final", iteration=39)
    point = find_resume_point(tmp_path)
    assert point.images_done == 320
    again = plan_continuation({**RECIPE, "gpus": 1}, 320, run_batch=8)
    assert again.start_iter == again.max_iter
    assert len(RunState(again, point, None).segments) == 1


@pytest.mark.parametrize("skip", [0, 5, 64, 150])
def test_every_world_consumes_the_same_stream_from_where_the_run_stopped(monkeypatch, skip):
    size, seed, take = 64, 7, 48

    def stream_of(world: int) -> list[int]:
        """What the world's micro-batches of 2 images per rank consume, in order."""
        per_rank = []
        for rank in range(world):
            monkeypatch.setattr(comm, "get_rank", lambda r=rank: r)
            monkeypatch.setattr(comm, "get_world_size", lambda w=world: w)
            sampler = ResumableTrainingSampler(size, seed, skip)
            per_rank.append(list(itertools.islice(iter(sampler), take // world)))
        out = []
        for step in range(take // (2 * world)):
            for rank in range(world):
                out += per_rank[rank][2 * step : 2 * step + 2]
        return sorted(out[: 2 * world]), out

    whole = list(itertools.islice(ResumableTrainingSampler(size, seed, 0)._stream_from(0), 400))
    for world in (1, 2, 4):
        first_step, consumed = stream_of(world)
        # Each micro-batch of the world is the next run of the stream (as a set: ranks
        # interleave within it), starting `skip` images in.
        assert first_step == sorted(whole[skip : skip + 2 * world])
        assert sorted(consumed) == sorted(whole[skip : skip + len(consumed)])
