"""The progress endpoint forgets a run when it is deleted, and the run's watch posts its
milestone events, on kmock with the real operator: nothing the hub holds for a run outlives it,
each evaluation is announced once, and a run re-created under the same name starts clean (its
own uid, its milestones from the start)."""

from __future__ import annotations

import asyncio

from kmock_helpers import (
    NAMESPACE,
    RUNS,
    apply,
    collect_garbage,
    delete,
    events_for,
    eventually,
    get,
    reconciled,
    run_body,
    stop_operator,
)
from progress_kmock import start_progress_operator


def _evaluated(cluster, name: str) -> list[str]:
    """The uids of the run objects the Evaluated events of ``name`` are about."""
    return [e["involvedObject"].get("uid") for e in events_for(cluster, name)
            if e.get("reason") == "Evaluated"]  # fmt: skip


async def test_the_hub_forgets_deleted_runs_and_a_recreated_run_starts_clean(cluster) -> None:
    op = await start_progress_operator(cluster)
    service = op.progress_service
    hub = service.hub
    try:
        names = [f"r{i}" for i in range(12)]
        for name in names:
            await apply(cluster, run_body(name))
        await reconciled(cluster, *names)
        await eventually(lambda: len(service.runs) == len(names), message="the runs' watch")
        evaluation = {"iteration": 100, "evalIteration": 100, "ap": 30.0, "ap50": 50.0}
        for name in names:
            hub.report(NAMESPACE, name, evaluation)
        await asyncio.to_thread(hub.flush)  # the hub's blocking client: off kmock's loop
        assert set(hub.runs) == {(NAMESPACE, n) for n in names}
        # The run's watch sees the new status.progress and posts the milestone, once.
        await eventually(lambda: all(_evaluated(cluster, n) for n in names),
                         message="an Evaluated event per run")  # fmt: skip
        old_uid = get(cluster, RUNS, "r0")["metadata"]["uid"]
        assert _evaluated(cluster, "r0") == [old_uid]

        for name in names:
            await delete(cluster, RUNS, name)
        await eventually(
            lambda: all(get(cluster, RUNS, n) is None for n in names), message="runs gone"
        )
        await eventually(lambda: not hub.runs and not len(service.runs),
                         message="the hub and the view to forget every deleted run")  # fmt: skip
        # Their jobs go by garbage collection (kmock's stand-in here), as on a cluster, before
        # the name is used again.
        assert len(await collect_garbage(cluster)) == len(names)

        # The same name again: a new run, its own uid; the same evaluation is news to it.
        await apply(cluster, run_body("r0"))
        await reconciled(cluster, "r0")
        new_uid = get(cluster, RUNS, "r0")["metadata"]["uid"]
        await eventually(lambda: getattr(service.runs.get(NAMESPACE, "r0"), "uid", "") == new_uid,
                         message="the new run in the view")  # fmt: skip
        # Its job made: until the controller's job index has dropped the old run's job (a watch
        # of its own, which may lag the runs'), the new run's reconcile finds that job under its
        # name, says so and tries again, and its status writes race the hub's for the same run.
        await eventually(lambda: (get(cluster, RUNS, "r0").get("status") or {}).get("jobUID"),
                         message="the new run's own job")  # fmt: skip
        hub.report(NAMESPACE, "r0", evaluation)
        # Written by this flush or by the service's own flush thread (every second), which can
        # take it first, or write it again after this one met the controller's writes of the
        # same run (three 409s in a row on a loaded 2-core machine: this flush returned 0).
        # Either way only a hub that forgot the old run writes it: the same evaluation would
        # be no news to the old run's record.
        await asyncio.to_thread(hub.flush)
        await eventually(lambda: len(_evaluated(cluster, "r0")) == 2, message="its own event")
        assert _evaluated(cluster, "r0") == [old_uid, new_uid] and new_uid != old_uid
    finally:
        await stop_operator(op)
