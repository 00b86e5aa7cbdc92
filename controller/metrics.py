"""The controller's Prometheus metrics (``megdet_controller_*``), in one module-level registry.

The names are a contract with the dashboards and alerts in charts/megdet-operator: change them
only together. Units follow Prometheus conventions (seconds, ``_total`` for counters). The five
job counters mirror the Kubeflow training operator's ``training_operator_jobs_*_total``
(created, deleted, successful, failed, restarted), with a ``target`` label because this
controller owns PyTorchJobs or TrainJobs.

The controller serves :data:`REGISTRY` on its ``metrics`` port (8080, ``/metrics``); see
:func:`serve`. A private registry (not the process-wide default) keeps the exposition to
these series, and lets tests read values without cross-talk from other libraries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Values of the ``phase`` label of RUNS: the MegDetRun status phases, owned by status.py.
from megdet.controller.status import PHASES

__all__ = [
    "JOBS_CREATED",
    "JOBS_DELETED",
    "JOBS_FAILED",
    "JOBS_RESTARTED",
    "JOBS_SUCCESSFUL",
    "PHASES",
    "RECONCILES",
    "RECONCILE_DURATION",
    "REGISTRY",
    "RESULTS",
    "RUNS",
    "RUN_INFO",
    "forget_run",
    "record_run_info",
    "sample",
    "serve",
    "set_run_phases",
]

#: Every registered collector lives here; `serve` exposes exactly this registry.
REGISTRY = CollectorRegistry()

#: Values of the ``result`` label of :data:`RECONCILES`.
RESULTS = ("success", "invalid", "error", "conflict", "refused")

RECONCILES = Counter(
    "megdet_controller_reconciles",
    "MegDetRun reconciles by result: success, invalid (spec refused), error (retried), "
    "conflict (the job's name, or the run's output folder, is taken; retried), refused (the "
    "API server refused the job: schema, admission webhook or quota; not retried until the "
    "spec changes).",
    ["result"],
    registry=REGISTRY,
)
RECONCILE_DURATION = Histogram(
    "megdet_controller_reconcile_duration_seconds",
    "Time to reconcile one MegDetRun: validate, render, create or look up the job, write status.",
    # Reconciles are API round trips plus an in-process Helm render: milliseconds to seconds.
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
RUNS = Gauge(
    "megdet_controller_runs",
    "MegDetRuns this controller has seen, by namespace and status phase.",
    ["namespace", "phase"],
    registry=REGISTRY,
)
JOBS_CREATED = Counter(
    "megdet_controller_jobs_created",
    "Jobs (PyTorchJob or TrainJob) created for MegDetRuns.",
    ["namespace", "target"],
    registry=REGISTRY,
)
JOBS_DELETED = Counter(
    "megdet_controller_jobs_deleted",
    "Jobs owned by MegDetRuns that were deleted: with their run, or on their own (the training "
    "operator's TTL after finishing, or by hand; the run then says JobPresent=False).",
    ["namespace", "target"],
    registry=REGISTRY,
)
JOBS_SUCCESSFUL = Counter(
    "megdet_controller_jobs_successful",
    "Jobs owned by MegDetRuns that succeeded.",
    ["namespace", "target"],
    registry=REGISTRY,
)
JOBS_FAILED = Counter(
    "megdet_controller_jobs_failed",
    "Jobs owned by MegDetRuns that failed.",
    ["namespace", "target"],
    registry=REGISTRY,
)
JOBS_RESTARTED = Counter(
    "megdet_controller_jobs_restarted",
    "Times a job owned by a MegDetRun entered its Restarting condition.",
    ["namespace", "target"],
    registry=REGISTRY,
)
RUN_INFO = Gauge(
    "megdet_controller_run_info",
    "One series per planned MegDetRun (value 1) carrying its plan: world size, global batch, LR.",
    ["namespace", "run", "target", "world_size", "global_batch", "lr"],
    registry=REGISTRY,
)

# (namespace, run) -> the label values of its run_info series, so a re-plan or a delete can
# remove the old series instead of leaving a stale one behind.
_run_info_labels: dict[tuple[str, str], tuple[str, ...]] = {}
# Namespaces that ever had a run, so their phase series go to 0 rather than vanish.
_phase_namespaces: set[str] = set()


def record_run_info(
    namespace: str, run: str, target: str, world_size: int, global_batch: int, lr: float
) -> None:
    """Set the run's ``megdet_controller_run_info`` series (replacing an older plan's)."""
    labels = (namespace, run, target, str(world_size), str(global_batch), _format_lr(lr))
    old = _run_info_labels.get((namespace, run))
    if old is not None and old != labels:
        RUN_INFO.remove(*old)
    _run_info_labels[(namespace, run)] = labels
    RUN_INFO.labels(*labels).set(1)


def forget_run(namespace: str, run: str) -> None:
    """Drop a deleted run's ``run_info`` series."""
    old = _run_info_labels.pop((namespace, run), None)
    if old is not None:
        RUN_INFO.remove(*old)


def set_run_phases(phases: Iterable[tuple[str, str]]) -> None:
    """Set ``megdet_controller_runs`` from (namespace, phase) pairs, one per known run.

    Every (namespace, phase) seen before but absent now is set to 0 rather than removed, so a
    dashboard's "runs by phase" drops to zero instead of showing a gap.
    """
    counts: dict[tuple[str, str], int] = {}
    for namespace, phase in phases:
        counts[(namespace, phase)] = counts.get((namespace, phase), 0) + 1
    _phase_namespaces.update(ns for ns, _ in counts)
    for namespace in _phase_namespaces:
        for phase in PHASES:
            RUNS.labels(namespace, phase).set(counts.get((namespace, phase), 0))


def sample(name: str, labels: Mapping[str, str] | None = None) -> float:
    """The current value of one series in :data:`REGISTRY` (0.0 when absent); for tests/bench."""
    value = REGISTRY.get_sample_value(name, dict(labels or {}))
    return 0.0 if value is None else value


def serve(port: int, addr: str = "0.0.0.0") -> None:  # a pod listens on its own IP
    """Serve :data:`REGISTRY` on ``http://addr:port/metrics`` from a background thread."""
    start_http_server(port, addr=addr, registry=REGISTRY)


def _format_lr(lr: float) -> str:
    # repr-style shortest round-trip text: 0.02 stays "0.02", not "0.020000000000000004".
    return repr(float(lr))
