"""Prometheus metrics of a training run: the metric names, the exporter hook, the run history.

Design (docs/trainer.md, "Metrics"):

* :data:`TRAINER_METRICS` (trainer/metric_specs.py) is the one list of what a trainer exports
  (names, types, labels, help); dashboards and alerts are checked against it
  (:data:`TRAINER_METRIC_NAMES`, :func:`build_registry`).
* :class:`PrometheusExporter` is a detectron2 hook: it reads what the loop already records (the
  event storage: iteration time, LR, losses, eval results, SyncBN divergence) after each step
  and sets gauges; it adds no code to the loop.
* One port per pod although a pod runs one process per GPU: prometheus_client's multiprocess
  mode. Every rank writes its values to memory-mapped files in ``PROMETHEUS_MULTIPROC_DIR``
  (one folder per pod); local rank 0 serves them all, merged by ``MultiProcessCollector``.
  Gauges use the ``mostrecent`` mode, which drops the ``pid`` label the other modes add: the
  per-rank gauges carry ``rank`` instead, and global gauges exist only in rank 0's process.
* Resumes and non-finite-loss events are appended to ``run_history.jsonl`` in the output
  folder (:class:`RunHistory`), so their counts survive restarts of the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detectron2.engine import hooks
from detectron2.utils import comm

from megdet.trainer.bn_health import DIVERGENCE_KEYS
from megdet.trainer.config import ConfigError
from megdet.trainer.evaluation import BOX_METRICS

# The metric table (trainer/metric_specs.py); its names stay importable from here.
from megdet.trainer.metric_specs import (
    COUNTER,
    ETA_WINDOW,
    HISTORY_FILE,
    LOSS_WINDOW,
    TRAINER_METRICS,
)
from megdet.trainer.metric_specs import TRAINER_METRIC_NAMES as TRAINER_METRIC_NAMES
from megdet.trainer.metric_specs import MetricSpec as MetricSpec

logger = logging.getLogger(__name__)

#: prometheus_client's multiprocess folder; must be set before prometheus_client is imported.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class TrainerMetrics:
    """The prometheus_client objects of :data:`TRAINER_METRICS` for one process.

    ``scopes`` picks which to create: ranks other than 0 create only the per-rank ones, so a
    pod without rank 0 exports no global series at all. ``registry=None`` registers nothing
    (multiprocess mode: the values live in files and the server's collector reads them).
    """

    def __init__(self, registry=None, scopes: tuple[str, ...] = ("global", "rank")) -> None:
        from prometheus_client import Counter, Gauge

        self._metrics: dict[str, Any] = {}
        for spec in TRAINER_METRICS:
            if spec.scope not in scopes:
                continue
            if spec.kind == COUNTER:
                # prometheus_client appends _total to a counter's name.
                metric = Counter(spec.name.removesuffix("_total"), spec.help, spec.labels,
                                 registry=registry)  # fmt: skip
            else:
                metric = Gauge(spec.name, spec.help, spec.labels, registry=registry,
                               multiprocess_mode="mostrecent")  # fmt: skip
            self._metrics[spec.name] = metric

    def __getitem__(self, name: str):
        return self._metrics[name]

    def __contains__(self, name: str) -> bool:
        return name in self._metrics


def build_registry():
    """A fresh single-process registry holding every trainer metric (for checks and tests)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    TrainerMetrics(registry)
    return registry


# --- run history -------------------------------------------------------------------------


def append_history(output_dir: str | Path, event: str, **fields: Any) -> None:
    """Append one event to the run history (one ``write`` of one line: safe across ranks)."""
    line = json.dumps({"event": event, "time": time.time(), **fields}) + "\n"
    fd = os.open(Path(output_dir) / HISTORY_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def count_history(output_dir: str | Path, event: str) -> int:
    """How many events of a kind the run history holds (0 without a history)."""
    path = Path(output_dir) / HISTORY_FILE
    if not path.is_file():
        return 0
    count = 0
    for line in path.read_text().splitlines():
        try:
            count += json.loads(line).get("event") == event
        except (json.JSONDecodeError, AttributeError):
            continue  # a line cut by a kill
    return count


class RunHistory(hooks.HookBase):
    """Records resumes (rank 0) and non-finite losses (the rank that met one) in the history.

    A resume is a start from a checkpoint (start iteration > 0). The non-finite loss comes from
    the seam in ``MegDetTrainer._check_finite`` (``trainer.nonfinite_error``); the run stops
    there, so the event is recorded in ``after_train``, which detectron2 runs on failure too.
    """

    def __init__(self, output_dir: str) -> None:
        self._output_dir = output_dir

    def before_train(self) -> None:
        if comm.is_main_process() and self.trainer.start_iter > 0:
            append_history(self._output_dir, "resume", iteration=self.trainer.start_iter)

    def after_train(self) -> None:
        err = getattr(self.trainer, "nonfinite_error", None)
        if err is not None:
            append_history(
                self._output_dir,
                "nonfinite_loss",
                iteration=self.trainer.iter,
                rank=comm.get_rank(),
                message=str(err),
            )


# --- serving ---------------------------------------------------------------------------


def default_multiproc_dir(port: int) -> Path:
    """The pod's metrics folder when ``PROMETHEUS_MULTIPROC_DIR`` is unset: by port, because
    one port is served per host and every local rank of the run knows it."""
    return Path(tempfile.gettempdir()) / f"megdet-metrics-{port}"


def _multiproc_dir(port: int) -> Path:
    path = Path(os.environ.setdefault(MULTIPROC_ENV, str(default_multiproc_dir(port))))
    from prometheus_client import values

    if not getattr(values.ValueClass, "_multiprocess", False):
        raise RuntimeError(
            f"prometheus_client was imported before {MULTIPROC_ENV} was set; the exporter "
            "needs its multiprocess mode"
        )
    return path


@dataclass
class MetricsServer:
    """Local rank 0's HTTP server and the pod's multiprocess folder it serves."""

    httpd: Any
    folder: Path
    #: The folder is :func:`default_multiproc_dir`'s (the trainer made it, nobody else reads
    #: it): removed at the stop once empty, so local runs leave no folder per port in /tmp.
    made_here: bool = False

    def stop(self) -> None:
        """Stop serving, release the port, delete the value files (nothing reads them now)."""
        self.httpd.shutdown()
        self.httpd.server_close()
        _remove_values(self.folder)
        if self.made_here:
            with contextlib.suppress(OSError):  # another rank's file still there: left as is
                self.folder.rmdir()


def _serve(port: int, path: Path) -> tuple[MetricsServer | None, str | None]:
    """Bind the port and serve the merged metrics of ``path``; (server, None) or (None, why)."""
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    made_here = path == default_multiproc_dir(port) and not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    try:
        httpd, _ = start_http_server(port, registry=registry)
    except OSError as err:
        if made_here:  # the run stops here: leave no folder behind
            with contextlib.suppress(OSError):
                path.rmdir()
        return None, f"cannot serve on port {port}: {err.strerror or err}"
    # Bound: this pod owns the folder now. Files of an earlier attempt would mix in.
    _remove_values(path)
    return MetricsServer(httpd, path, made_here=path == default_multiproc_dir(port)), None


def _remove_values(path: Path) -> None:
    """Delete the value files of a multiprocess folder (an earlier attempt's, or ours at exit)."""
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)


def start_metrics_server(port: int) -> MetricsServer | None:
    """Local rank 0 serves the pod's metrics on ``port``; collective over the world.

    Returns the server on local rank 0 (None elsewhere). If any pod cannot bind its port,
    every rank raises ConfigError naming the key, so the run stops with exit 2 before training.
    """
    path = _multiproc_dir(port)
    server, problem = _serve(port, path) if comm.get_local_rank() == 0 else (None, None)
    problems = [p for p in comm.all_gather(problem) if p]  # also the barrier after the clean-up
    if problems:
        if server is not None:
            server.stop()
        raise ConfigError(
            f"MEGDET.METRICS.PORT: {problems[0]}; choose a free port or 0 (metrics off)"
        )
    if server is not None:
        logger.info("Serving Prometheus metrics on port %d (/metrics, from %s)", port, path)
    return server


# --- the exporter hook -----------------------------------------------------------------


@dataclass
class RunFacts:
    """What the exporter needs to know about the run besides the trainer."""

    output_dir: str
    plan: Any  # megdet.plan.Plan
    sync_bn: str
    bn_group_size: int
    images_per_step: int  # per rank: IMAGES_PER_GPU x ACCUMULATION_STEPS
    checkpointer: Any = None  # AtomicCheckpointer (rank 0 listens for complete saves)
    on_cuda: bool = False


class PrometheusExporter(hooks.HookBase):
    """Sets the trainer metrics after every step from the event storage (see module doc).

    Register it after the hooks that write what it reads (IterationTimer, LRScheduler,
    EvalHook, SyncBNHealthCheck, RunHistory).
    """

    def __init__(
        self, metrics: TrainerMetrics, facts: RunFacts, server: MetricsServer | None = None
    ) -> None:
        self._m = metrics
        self._facts = facts
        self._server = server
        self._main = "megdet_train_iteration" in metrics
        rank = str(comm.get_rank())
        self._images = metrics["megdet_train_images_total"].labels(rank=rank)
        self._iter_seconds = metrics["megdet_train_iteration_seconds"].labels(rank=rank)
        self._data_seconds = metrics["megdet_train_data_seconds"].labels(rank=rank)
        # No GPU, no series (a child would expose 0 from its creation on).
        gpu = metrics["megdet_train_gpu_memory_max_bytes"]
        self._gpu_memory = gpu.labels(rank=rank) if facts.on_cuda else None
        self._nonfinite_seen = 0

    # rank 0 only ------------------------------------------------------------------------

    def _start_globals(self) -> None:
        facts, m = self._facts, self._m
        plan = facts.plan
        m["megdet_train_max_iterations"].set(plan.max_iter)
        m["megdet_train_iteration"].set(self.trainer.start_iter)
        m["megdet_train_world_size"].set(plan.world_size)
        m["megdet_train_nodes"].set(plan.nodes)
        m["megdet_train_run_info"].labels(
            world_size=str(plan.world_size),
            sync_bn=facts.sync_bn,
            bn_group_size=str(facts.bn_group_size or plan.world_size),
            global_batch=str(plan.global_batch),
        ).set(1)
        m["megdet_train_resumes"].set(count_history(facts.output_dir, "resume"))
        self._sync_nonfinite()
        if facts.checkpointer is not None:
            last = facts.checkpointer.get_checkpoint_file()  # named by last_checkpoint
            if last and os.path.isfile(last):
                m["megdet_train_last_checkpoint_timestamp_seconds"].set(os.path.getmtime(last))
            facts.checkpointer.on_saved.append(self._checkpoint_saved)

    def _checkpoint_saved(self, path: Path) -> None:
        self._m["megdet_train_last_checkpoint_timestamp_seconds"].set(time.time())

    def _sync_nonfinite(self) -> None:
        count = count_history(self._facts.output_dir, "nonfinite_loss")
        if count > self._nonfinite_seen:
            self._m["megdet_train_nonfinite_loss_total"].inc(count - self._nonfinite_seen)
            self._nonfinite_seen = count

    def _export_globals(self, done: int) -> None:
        m, storage = self._m, self.trainer.storage
        m["megdet_train_iteration"].set(done)
        latest = storage.latest()
        if "lr" in latest:
            m["megdet_train_learning_rate"].set(latest["lr"][0])
        m["megdet_train_planned_learning_rate"].set(self._facts.plan.lr_at(done - 1))
        loss = m["megdet_train_loss"]
        for key in latest:
            if key.startswith("loss_") or key == "total_loss":
                component = "total" if key == "total_loss" else key
                loss.labels(component=component).set(storage.history(key).median(LOSS_WINDOW))
        if "time" in latest:
            left = self._facts.plan.max_iter - done
            eta = storage.history("time").median(ETA_WINDOW) * left
            m["megdet_train_eta_seconds"].set(eta)
        for stat, key in DIVERGENCE_KEYS.items():
            if key in latest:
                m["megdet_syncbn_divergence"].labels(stat=stat).set(latest[key][0])
        self._export_eval(latest)

    def _export_eval(self, latest: dict[str, tuple[float, int]]) -> None:
        for name in BOX_METRICS:
            value = latest.get(f"bbox/{name}")
            if value is not None:
                self._m["megdet_eval_ap"].labels(metric=name).set(value[0])

    # hooks ------------------------------------------------------------------------------

    def before_train(self) -> None:
        if self._main:
            self._start_globals()

    def after_step(self) -> None:
        self._images.inc(self._facts.images_per_step)
        latest = self.trainer.storage.latest()
        if "time" in latest:
            self._iter_seconds.set(latest["time"][0])
        data_time = getattr(self.trainer, "data_time", None)
        if data_time is not None:
            self._data_seconds.set(data_time)
        if self._gpu_memory is not None:
            import torch

            self._gpu_memory.set(torch.cuda.max_memory_allocated())
        if self._main:
            self._export_globals(self.trainer.iter + 1)

    def after_train(self) -> None:
        if self._main:
            # The last evaluation runs in EvalHook.after_train, before this hook.
            self._export_eval(self.trainer.storage.latest())
            self._sync_nonfinite()
        if self._server is not None:
            self._server.stop()
            self._server = None


def build_monitoring_hooks(cfg, plan, bundle, progress=None) -> list[hooks.HookBase]:
    """The run history, the SyncBN health check, (MEGDET.METRICS.PORT > 0) the exporter,
    (rank 0) the run's report (trainer/report_hook.py) and (``KUBEFLOW_TRAINER_SERVER_URL``
    set, rank 0) the progress reporter (trainer/progress_reporter.py).

    Collective (the health check's groups, the exporter's port agreement): call on every rank,
    after ``build_trainer``. Raises ConfigError on every rank when a metrics port is taken.
    """
    from megdet.trainer.bn_health import build_health_check

    result: list[hooks.HookBase] = [RunHistory(cfg.OUTPUT_DIR)]
    check = build_health_check(cfg, bundle.model)
    if check is not None:
        result.append(check)
    port = cfg.MEGDET.METRICS.PORT
    metrics = None
    if port:
        server = start_metrics_server(port)
        scopes = ("global", "rank") if comm.is_main_process() else ("rank",)
        facts = RunFacts(
            output_dir=cfg.OUTPUT_DIR,
            plan=plan,
            sync_bn=cfg.MEGDET.SYNC_BN,
            bn_group_size=cfg.MEGDET.BN_GROUP_SIZE,
            images_per_step=cfg.MEGDET.IMAGES_PER_GPU * cfg.MEGDET.ACCUMULATION_STEPS,
            checkpointer=bundle.checkpointer,
            on_cuda=next(bundle.model.parameters()).is_cuda,
        )
        metrics = TrainerMetrics(scopes=scopes)
        result.append(PrometheusExporter(metrics, facts, server))
    # The network each rank's NCCL uses, from NCCL's init log: logged, exported, reported.
    from megdet.trainer.fabric import report_fabric, run_report

    fabrics = report_fabric(metrics)
    report = None
    if comm.is_main_process():
        # After build_trainer's hooks, whose after_train writes what it reads (the last
        # evaluation, the events); before the progress reporter, whose final report carries it.
        from megdet.trainer.report_hook import WriteReport

        report = WriteReport(cfg.OUTPUT_DIR)
        result.append(report)
    # Progress reports to Trainer's status server (rank 0, KUBEFLOW_TRAINER_SERVER_URL set).
    from megdet.trainer.progress_reporter import build_progress_hook

    if progress is None:  # else made before the trainer (train.py: the loading stage)
        progress = build_progress_hook(plan)
    if progress is not None:
        progress.attach(bundle.checkpointer, run_report(fabrics), report)
        result.append(progress)
    return result
