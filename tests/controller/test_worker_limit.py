"""The controller's worker limit (``megdet controller --worker-limit``, controller/operator.py):
at most N objects of a kind handled at once, but only once the operator is indexed, so that a
controller which starts with more runs than the limit still reconciles every one (kopf's own
``settings.queueing.worker_limit`` deadlocks there: kopf issue #1243, docs/capacity.md).

The scheduler tests run kopf's own ``aiotasks.Scheduler`` with the limit; the operator tests
run the real operator on the emulator."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kmock_helpers import (
    apply,
    eventually,
    is_create,
    reconciled,
    run_body,
    start_operator,
    stop_operator,
)
from kopf._cogs.aiokits import aiotasks

from megdet.controller.operator import IndexedWorkerLimit


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "10", None])
def test_a_limit_is_a_whole_number_of_at_least_one(limit: Any) -> None:
    with pytest.raises(ValueError, match="whole number >= 1"):
        IndexedWorkerLimit(limit)


def test_unbounded_until_indexed_then_bounded() -> None:
    bound = IndexedWorkerLimit(3)
    assert all(bound.allows(n) for n in (0, 3, 10_000))
    bound.note_indexed()
    assert [bound.allows(n) for n in (0, 2, 3, 4)] == [True, True, False, False]
    # Both ways kopf could write the comparison give the same answer.
    running = [2, 3]
    assert [n < bound for n in running] == [bound > n for n in running] == [True, False]


async def _settle() -> None:
    """Let kopf's spawner task act on what it was told (loop turns, no wall-clock wait)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_kopfs_scheduler_starts_all_workers_before_indexing_and_at_most_the_limit_after() -> (
    None
):
    bound = IndexedWorkerLimit(2)
    scheduler = aiotasks.Scheduler(limit=bound)  # type: ignore[arg-type]  # as limit_workers does
    running = 0
    most = 0  # workers running at once once the five listed ones are gone
    started: list[str] = []
    gates: dict[str, asyncio.Event] = {}

    async def worker(name: str) -> None:
        nonlocal running, most
        running += 1
        if name.startswith("new"):
            most = max(most, running)
        started.append(name)
        try:
            await gates[name].wait()
        finally:
            running -= 1

    async def spawn(name: str) -> None:
        gates[name] = asyncio.Event()
        await scheduler.spawn(worker(name), name=name)

    try:
        # Before indexing: every worker starts, however many (these would wait for the index).
        for i in range(5):
            await spawn(f"listed-{i}")
        await eventually(lambda: running == 5, message="all five listed objects' workers")
        bound.note_indexed()
        # Once indexed: five still run, so none of three newcomers starts.
        for i in range(3):
            await spawn(f"new-{i}")
        await _settle()
        assert [n for n in started if n.startswith("new")] == []
        for i in range(5):
            gates[f"listed-{i}"].set()
        await eventually(lambda: len(started) == 7, message="two newcomers to start")
        await _settle()
        assert running == 2 and len(started) == 7  # the third waits for a place
        gates[started[5]].set()
        await eventually(lambda: len(started) == 8, message="the third newcomer to start")
        assert most == 2
    finally:
        for gate in gates.values():
            gate.set()
        await scheduler.close()


async def test_a_controller_that_starts_with_more_runs_than_the_limit_reconciles_every_one(
    cluster,
) -> None:
    """The case kopf's plain limit hangs on (kopf issue #1243): six runs exist before the controller
    starts, with a limit of one."""
    names = [f"waiting-{i}" for i in range(6)]
    for name in names:
        await apply(cluster, run_body(name))
    op = await start_operator(str(cluster.url), worker_limit=1)
    try:
        await reconciled(cluster, *names, timeout=60.0)
        assert op.limit is not None and op.limit.indexed
    finally:
        await stop_operator(op)


def _hold_job_creates(api: Any, release: asyncio.Event | None, seconds: float) -> dict[str, int]:
    """Hold each PyTorchJob create until ``release`` is set (or for ``seconds``), counting the
    creates in flight at once."""
    seen = {"now": 0, "most": 0, "all": 0}
    match = is_create("pytorchjobs")

    async def react(request: Any) -> Any:
        if not match(request):
            raise NotImplementedError  # not ours: kmock serves it
        seen["now"] += 1
        seen["all"] += 1
        seen["most"] = max(seen["most"], seen["now"])
        try:
            if release is not None:
                await release.wait()
            else:
                await asyncio.sleep(seconds)
        finally:
            seen["now"] -= 1
        raise NotImplementedError  # served now, after the hold

    api << react
    return seen


@pytest.mark.parametrize("limit", [0, 2])
async def test_once_indexed_a_burst_is_handled_at_most_limit_runs_at_once(cluster, limit) -> None:
    """With a limit of two, six runs applied at once have at most two job creates in flight;
    without one (0), the same six reach three at once (the kopf threads allow six)."""
    op = await start_operator(str(cluster.url), worker_limit=limit)
    try:
        await apply(cluster, run_body("first"))
        await reconciled(cluster, "first")
        if limit:
            assert op.limit is not None and op.limit.indexed
        release = None if limit else asyncio.Event()
        seen = _hold_job_creates(cluster, release, seconds=0.3)
        names = [f"burst-{i}" for i in range(6)]
        for name in names:
            await apply(cluster, run_body(name))
        if release is not None:
            await eventually(lambda: seen["now"] >= 3, message="three job creates at once")
            release.set()
        await reconciled(cluster, *names, timeout=60.0)
        assert seen["all"] >= 6
        if limit:
            assert 1 <= seen["most"] <= limit, seen
        else:
            assert seen["most"] >= 3, seen
    finally:
        await stop_operator(op)
