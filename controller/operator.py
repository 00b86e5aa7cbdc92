"""The MegDetRun operator: kopf's registry of the handlers (:func:`build_registry`), and kopf's
settings (:func:`configure`: a retried handler's progress in annotations, the diff base in
``status.handledConfiguration``). What each module of the controller does:
docs/architecture.md, "The controller".
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from megdet.controller import progress_events
from megdet.controller.api import FINALIZER, GROUP, OWNED_KINDS, PLURAL, TARGET_BY_KIND, VERSION
from megdet.controller.diffbase import ProgressAnnotations, StatusDiffBase
from megdet.controller.lifecycle_watch import LifecycleWatch
from megdet.controller.pod_problems import PART_OF
from megdet.controller.reconciler import OUTPUTS_INDEX, Reconciler

__all__ = ["IDLE_SECONDS", "IndexedWorkerLimit", "build_registry", "configure", "limit_workers"]

#: Seconds an object's kopf worker stays after its last event (kopf's default is 5): a waiting
#: worker keeps its place under :class:`IndexedWorkerLimit` (docs/capacity.md).
IDLE_SECONDS = 1.0


class IndexedWorkerLimit:
    """kopf's ``settings.queueing.worker_limit`` (objects of one watched kind handled at once),
    unbounded until :meth:`note_indexed`, then ``limit`` (docs/capacity.md, "What limits one
    replica": why a plain limit deadlocks kopf at start-up)."""

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"a worker limit is a whole number >= 1, not {limit!r}")
        self.limit = limit
        self.indexed = False

    def note_indexed(self) -> None:
        self.indexed = True

    def allows(self, running: int) -> bool:
        """May one more worker start while ``running`` run?"""
        return not self.indexed or running < self.limit

    # kopf writes ``len(running) < limit``: int refuses the comparison, Python asks this one.
    def __gt__(self, running: int) -> bool:
        return self.allows(running)

    def __repr__(self) -> str:
        state = "bounded" if self.indexed else "not yet indexed, unbounded"
        return f"IndexedWorkerLimit({self.limit}, {state})"


def build_registry(handlers: Reconciler) -> kopf.OperatorRegistry:
    """A kopf registry with the MegDetRun handlers of ``handlers`` (one operator's
    :class:`~megdet.controller.reconciler.Reconciler`); docs/architecture.md, "The controller"."""
    registry = kopf.OperatorRegistry()
    for register in (kopf.on.create, kopf.on.resume, kopf.on.update):
        register(GROUP, VERSION, PLURAL, registry=registry, id="reconcile")(handlers.reconcile)
    # The runs by output folder: a reconcile reads it instead of listing the namespace.
    kopf.index(GROUP, VERSION, PLURAL, registry=registry, id=OUTPUTS_INDEX)(handlers.index_outputs)
    # A deleted run: what this process holds for it goes with its watch's DELETED event (no
    # delete handler, so no finalizer: docs/controller.md).
    forget = handlers.forget

    async def run_deleted(event: Any, name: str, namespace: str, **_: Any) -> None:
        if event.get("type") == "DELETED":
            forget(namespace, name)

    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="run-deleted")(run_deleted)
    # The runs as their watch delivers them: a status write reads no run (status_writer.py).
    handlers.writer.views.register(registry)
    # The run-owned jobs as their watch delivers them: the job reads (job_cache.py).
    cache = getattr(handlers.cluster, "cache", None)
    if cache is not None:
        cache.register(registry, when=handlers.owned_by_run)
    for (api_version, kind), plural in OWNED_KINDS.items():
        if kind in TARGET_BY_KIND:
            group, version = api_version.split("/", 1)
            kopf.on.event(
                group,
                version,
                plural,
                registry=registry,
                when=handlers.owned_by_run,
                id=f"mirror-{kind}",
            )(handlers.job_event)
    # The run's pods (the run chart's label, selected by the API server): why they cannot start.
    kopf.on.event(
        "v1",
        "pods",
        registry=registry,
        labels={PART_OF[0]: PART_OF[1]},
        when=handlers.pod_matters,
        id="pods-started",
    )(handlers.pod_event)
    # Where the run is (Admitted, PodsScheduled, Initialized, Training, Evaluating).
    LifecycleWatch(handlers.writer).register(registry)
    # Milestone events from the old and new status.progress, both targets (progress_events.py).
    progress_events.register(registry, handlers.records, handlers.checkpoint_events)
    return registry


def limit_workers(
    registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, limit: int
) -> IndexedWorkerLimit:
    """At most ``limit`` objects of each watched kind (per namespace when the controller
    watches namespaces) handled at once, once the operator is indexed (docs/capacity.md)."""
    bound = IndexedWorkerLimit(limit)

    # kopf calls a handler only once every index is complete: the bound is safe from then on.
    async def indexed(**_: Any) -> None:
        bound.note_indexed()

    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="worker-limit")(indexed)
    settings.queueing.worker_limit = bound  # type: ignore[assignment]  # see IndexedWorkerLimit
    return bound


def configure(
    settings: kopf.OperatorSettings,
    *,
    diffbase: StatusDiffBase,
    peering: str | None,
    fast: bool = False,
    workers: int | None = None,
) -> None:
    """Operator settings: kopf's bookkeeping, the old finalizer, peering, timings.
    ``diffbase``: the handlers' (``Reconciler.diffbase``); ``fast`` shortens kopf's delays
    (tests and the benchmark). Why each: docs/controller.md, "kopf's bookkeeping rides on the
    status write"."""
    # A retried handler's progress in annotations; the diff base in the status (diffbase.py).
    settings.persistence.progress_storage = ProgressAnnotations()
    settings.persistence.diffbase_storage = diffbase
    # Earlier controllers added this finalizer; kopf removes it, as any no handler needs.
    settings.persistence.finalizer = FINALIZER
    # No scanning of CRDs and namespaces: fixed resources, smaller RBAC (docs/operations.md).
    settings.scanning.disabled = True
    # The pods' watch: the run chart's trainer pods only, filtered by the API server.
    settings.watching.label_selectors["v1", "pods"] = f"{PART_OF[0]}={PART_OF[1]}"
    # Of kopf's own log lines only warnings and errors become Events (ours always post).
    settings.posting.level = logging.WARNING
    if workers is not None:
        # kopf's thread pool for the sync handlers (docs/capacity.md).
        settings.execution.max_workers = workers
    # (kopf.run sets peering.clusterwide from its own ``clusterwide``: docs/operations.md.)
    if peering:
        settings.peering.name = peering
        settings.peering.mandatory = True
    else:
        settings.peering.standalone = True
    settings.queueing.idle_timeout = IDLE_SECONDS
    if fast:
        settings.queueing.exit_timeout = 1.0
        settings.queueing.error_delays = (0.1, 0.2, 0.5, 1.0)
        settings.posting.idle_timeout = 0.2
        settings.watching.reconnect_backoff = 0.05
        # A peer whose record is older than this is dead, and its follower acts. At 3 s a
        # leader's keepalive (every second) came late on a loaded 2-core CI machine and its
        # follower created a job (tests/controller/test_progress_ha.py). A stopping operator
        # marks its record dead itself (kopf's keepalive), so no test waits for this.
        settings.peering.lifetime = 30
        settings.networking.error_backoffs = (0.05, 0.1, 0.2)
