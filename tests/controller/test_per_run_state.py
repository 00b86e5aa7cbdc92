"""Nothing the controller keeps for a run outlives it, on kmock with the real
operator serving the progress endpoint: the per-run status lock, the progress hub, the
served-run directory, the run's ``megdet_controller_run_info`` series, the runs' records
(run_record.RunRecords: phase, milestones, stuck pods, diff base), the job cache
(job_cache.JobCache), the runs' views (status_writer.RunViews) and the kept renders (render.py)
all hold the runs while they exist and nothing of them once every run is deleted, so a burst of
runs that come and go leaves the controller's memory where it was (the RSS itself is measured by
``bench/controller_reconcile.py --delete``, docs/benchmarks.md)."""

from __future__ import annotations

import asyncio

from kmock_helpers import (
    NAMESPACE,
    RUNS,
    apply,
    collect_garbage,
    delete,
    eventually,
    get,
    reconciled,
    run_body,
)
from progress_kmock import start_progress_operator

from megdet.controller import metrics
from megdet.controller.render import default_renderer

RUN_COUNT = 12


def run_info_names() -> set[str]:
    """The runs of the test namespace that have a run_info series now."""
    names = set()
    for family in metrics.RUN_INFO.collect():
        for sample in family.samples:
            if sample.labels.get("namespace") == NAMESPACE:
                names.add(sample.labels["run"])
    return names


async def test_no_per_run_structure_outlives_its_run(cluster) -> None:
    op = await start_progress_operator(cluster)
    try:
        service, reconciler = op.progress_service, op.reconciler
        names = [f"gone-{i:02d}" for i in range(RUN_COUNT)]
        for name in names:
            await apply(cluster, run_body(name))
        await reconciled(cluster, *names)
        await eventually(
            lambda: all(service.runs.get(NAMESPACE, n) is not None for n in names),
            message="the progress endpoint to know every run",
        )
        evaluation = {"iteration": 100, "evalIteration": 100, "ap": 30.0, "ap50": 50.0}
        for name in names:  # the hub's blocking client runs off the loop kmock serves from
            await asyncio.to_thread(service.hub.report, NAMESPACE, name, evaluation)
        assert {(NAMESPACE, n) for n in names} <= set(service.hub.runs)
        assert set(names) <= run_info_names()
        assert {(NAMESPACE, n) for n in names} <= set(default_renderer().memo_keys())
        assert reconciler.cluster.cache.serves("PyTorchJob")
        assert len(reconciler.cluster.cache) >= len(names)
        views = reconciler.writer.views
        assert all(views.lookup(NAMESPACE, n, None) is not None for n in names)
        records = reconciler.records
        assert all(records.get((NAMESPACE, n), "phase") is not None for n in names)

        for name in names:
            await delete(cluster, RUNS, name)
        await eventually(
            lambda: all(get(cluster, RUNS, n) is None for n in names), message="runs gone"
        )
        # Their jobs go by garbage collection (kmock's stand-in here): the job cache drops
        # each when its watch says so.
        assert len(await collect_garbage(cluster)) == len(names)
        await eventually(
            lambda: (
                not any(key[1] in names for key in service.hub.runs)
                and len(service.runs) == 0
                and not run_info_names() & set(names)
                and len(reconciler.writer.locks) == 0
                and len(reconciler.cluster.cache) == 0
                and len(views) == 0
                and not {key[1] for key in records} & set(names)
                and all(views.gone(NAMESPACE, n, None) for n in names)
                and not {key[1] for key in default_renderer().memo_keys()} & set(names)
            ),
            message="every per-run structure to let its run go",
        )
    finally:
        await asyncio.to_thread(op.stop)
