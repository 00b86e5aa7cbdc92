"""The trainer's Prometheus metrics: names and labels, what the exporter hook sets, run history.

The multiprocess exporter (one port per pod, 2 ranks) and the SyncBN health check run on 2 gloo
workers in test_trainer_metrics_dist.py.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from trainer_fakes import LinearDetector

from tests.tiny_train import train_command

ROOT = Path(__file__).resolve().parents[2]

#: The metric contract (docs/trainer.md, the metrics table): name -> (type, labels). Global
#: unless labelled rank.
CONTRACT = {
    "megdet_train_iteration": ("gauge", set()),
    "megdet_train_max_iterations": ("gauge", set()),
    "megdet_train_loss": ("gauge", {"component"}),
    "megdet_train_learning_rate": ("gauge", set()),
    "megdet_train_planned_learning_rate": ("gauge", set()),
    "megdet_train_images_total": ("counter", {"rank"}),
    "megdet_train_iteration_seconds": ("gauge", {"rank"}),
    "megdet_train_data_seconds": ("gauge", {"rank"}),
    "megdet_train_eta_seconds": ("gauge", set()),
    "megdet_train_gpu_memory_max_bytes": ("gauge", {"rank"}),
    "megdet_train_run_info": ("gauge", {"world_size", "sync_bn", "bn_group_size", "global_batch"}),
    "megdet_train_world_size": ("gauge", set()),
    "megdet_train_nodes": ("gauge", set()),
    "megdet_eval_ap": ("gauge", {"metric"}),
    "megdet_train_last_checkpoint_timestamp_seconds": ("gauge", set()),
    "megdet_train_nonfinite_loss_total": ("counter", set()),
    "megdet_train_resumes": ("gauge", set()),
    "megdet_syncbn_divergence": ("gauge", {"stat"}),
    "megdet_train_fabric_info": ("gauge", {"rank", "transport", "requested"}),
}


def samples(text: str) -> dict[str, list]:
    """Exposition text -> sample name -> [Sample] (prometheus_client's own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def test_metric_list_is_the_contract_and_the_registry_exposes_it():
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from megdet.trainer.metrics import TRAINER_METRIC_NAMES, TRAINER_METRICS, build_registry

    assert set(TRAINER_METRIC_NAMES) == set(CONTRACT)
    for spec in TRAINER_METRICS:
        assert (spec.kind, set(spec.labels)) == CONTRACT[spec.name], spec.name
        assert (spec.scope == "rank") == ("rank" in spec.labels), spec.name
    families = {
        f.name + ("_total" if f.type == "counter" else ""): f.type
        for f in text_string_to_metric_families(generate_latest(build_registry()).decode())
        # prometheus_client's own creation-time series of counters (single-process mode only).
        if not f.name.endswith("_created")
    }
    assert {name: kind for name, (kind, _) in CONTRACT.items()} == families


def test_single_process_exposition_passes_promtool_check_metrics():
    from prometheus_client import CollectorRegistry, generate_latest

    from megdet.trainer.metrics import TrainerMetrics
    from tests.prometheus_harness import promtool

    registry = CollectorRegistry()
    metrics = TrainerMetrics(registry)
    for name, (_, labels) in CONTRACT.items():  # one series each, so labels are linted too
        metric = metrics[name].labels(**{k: "x" for k in labels}) if labels else metrics[name]
        if name.endswith("_total"):
            metric.inc(1)
        else:
            metric.set(1)
    # promtool is unpacked by `make test`'s set-up; a missing one is an error, never a skip.
    result = promtool("check", "metrics", stdin=generate_latest(registry).decode())
    assert result.returncode == 0 and not result.stdout and not result.stderr, result


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("MEGDET.METRICS.PORT", "70000", "MEGDET.METRICS.PORT: 70000 is invalid: expected a port"),
        ("MEGDET.METRICS.PORT", "-1", "MEGDET.METRICS.PORT: -1 is invalid"),
        ("MEGDET.METRICS.PORT", "'9477'", "MEGDET.METRICS.PORT: \"'9477'\" is invalid"),
        ("MEGDET.SYNCBN_CHECK_PERIOD", "-5", "MEGDET.SYNCBN_CHECK_PERIOD: -5 is invalid"),
    ],
)
def test_bad_metrics_config_values_are_errors_naming_the_key(key, value, message):
    from megdet.trainer.config import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config("megdet_tiny_cpu", [key, value])
    assert str(err.value).startswith(message)


# --- the exporter hook in one process ----------------------------------------------------


def _two_losses() -> LinearDetector:
    return LinearDetector(
        lambda out: {"loss_cls": (out**2).mean(), "loss_box_reg": out.abs().mean()}
    )


def _tiny_plan(max_iter: int):
    from megdet.plan import plan_run

    return plan_run(
        {"gpus": 1, "images_per_gpu": 2, "reference_batch": 2, "base_lr": 0.1,
         "max_iter": max_iter, "steps": (max_iter - 1,), "warmup_iters": 2}
    )  # fmt: skip


def _one_process_run(out: Path, start_iter: int, max_iter: int, evaluate=None):
    """A real MegDetTrainer with detectron2's hooks, the run history and the exporter."""
    from detectron2.engine import hooks
    from prometheus_client import CollectorRegistry

    from megdet.trainer.checkpoint import AtomicCheckpointer
    from megdet.trainer.engine import MegDetTrainer
    from megdet.trainer.metrics import PrometheusExporter, RunFacts, RunHistory, TrainerMetrics
    from megdet.trainer.solver import PlanParamScheduler

    plan = _tiny_plan(max_iter)
    model = _two_losses()
    optimizer = torch.optim.SGD(model.parameters(), lr=plan.lr)
    for group in optimizer.param_groups:  # what loading a checkpoint's optimizer state restores
        group["initial_lr"] = plan.lr
    data = iter([torch.randn(2, 3) for _ in range(max_iter)])
    trainer = MegDetTrainer(model, data, optimizer)
    checkpointer = AtomicCheckpointer(model, str(out))
    registry = CollectorRegistry()
    facts = RunFacts(str(out), plan, "backbone", 0, images_per_step=2, checkpointer=checkpointer)
    trainer.register_hooks(
        [
            hooks.IterationTimer(),
            hooks.LRScheduler(optimizer, PlanParamScheduler(plan)),
            hooks.PeriodicCheckpointer(checkpointer, period=1000),  # saves model_final
            hooks.EvalHook(0, evaluate) if evaluate else None,
            RunHistory(str(out)),
            PrometheusExporter(TrainerMetrics(registry), facts),
        ]
    )
    trainer.train(start_iter, max_iter)
    return plan, registry


def _value(found: dict, name: str, **labels) -> float:
    matching = [s.value for s in found[name] if s.labels == labels]
    assert len(matching) == 1, (name, labels, found.get(name))
    return matching[0]


def test_exporter_sets_every_metric_from_what_the_loop_records(tmp_path):
    from prometheus_client import generate_latest

    from megdet.trainer.evaluation import BOX_METRICS

    box = {name: 10.0 + i for i, name in enumerate(BOX_METRICS)}
    started = time.time()
    plan, registry = _one_process_run(tmp_path, 0, 6, evaluate=lambda: {"bbox": dict(box)})
    found = samples(generate_latest(registry).decode())

    assert (
        _value(found, "megdet_train_iteration") == 6 == _value(found, "megdet_train_max_iterations")
    )
    # The LR the scheduler set for the last iteration, next to the plan's for that iteration.
    assert _value(found, "megdet_train_learning_rate") == pytest.approx(plan.lr_at(5))
    assert _value(found, "megdet_train_planned_learning_rate") == pytest.approx(plan.lr_at(5))
    components = {s.labels["component"] for s in found["megdet_train_loss"]}
    assert components == {"loss_cls", "loss_box_reg", "total"}
    assert _value(found, "megdet_train_images_total", rank="0") == 12  # 6 steps x 2 images
    assert _value(found, "megdet_train_iteration_seconds", rank="0") > 0
    assert _value(found, "megdet_train_data_seconds", rank="0") >= 0
    assert _value(found, "megdet_train_eta_seconds") == 0  # finished
    assert "megdet_train_gpu_memory_max_bytes" not in found  # CPU: no series
    info = found["megdet_train_run_info"]
    assert [s.labels for s in info] == [
        {"world_size": "1", "sync_bn": "backbone", "bn_group_size": "1", "global_batch": "2"}
    ]
    # What the efficiency rules divide by (monitoring/efficiency.py): the world it trains on.
    assert _value(found, "megdet_train_world_size") == 1 == _value(found, "megdet_train_nodes")
    assert {s.labels["metric"]: s.value for s in found["megdet_eval_ap"]} == box
    stamp = _value(found, "megdet_train_last_checkpoint_timestamp_seconds")
    assert started <= stamp <= time.time()
    assert (tmp_path / "model_final.pth").is_file()
    assert _value(found, "megdet_train_resumes") == 0
    assert _value(found, "megdet_train_nonfinite_loss_total") == 0


def test_resumes_and_nonfinite_losses_are_counted_across_restarts(tmp_path):
    from prometheus_client import generate_latest

    from megdet.trainer.metrics import append_history

    append_history(tmp_path, "nonfinite_loss", iteration=1, rank=1, message="earlier attempt")
    for attempt in (1, 2):
        # A restart resumes (start iteration > 0) and exports the history of the whole run.
        _, registry = _one_process_run(tmp_path, 2 + attempt, 6)
        found = samples(generate_latest(registry).decode())
        assert _value(found, "megdet_train_resumes") == attempt
        assert _value(found, "megdet_train_nonfinite_loss_total") == 1
        assert _value(found, "megdet_train_iteration") == 6
    # A finished run started again saves nothing: the last checkpoint is the earlier attempt's.
    _, registry = _one_process_run(tmp_path, 6, 6)
    found = samples(generate_latest(registry).decode())
    assert _value(found, "megdet_train_resumes") == 3
    assert _value(found, "megdet_train_last_checkpoint_timestamp_seconds") == (
        (tmp_path / "model_final.pth").stat().st_mtime
    )


class _Exploding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, batch):
        return {"loss_cls": self.w.sum() * float("nan")}


def test_a_nonfinite_loss_is_recorded_in_the_run_history_by_the_rank_that_met_it(tmp_path):
    from megdet.trainer.engine import MegDetTrainer, NonFiniteLossError
    from megdet.trainer.metrics import HISTORY_FILE, RunHistory, count_history

    model = _Exploding()
    trainer = MegDetTrainer(model, iter([0, 0]), torch.optim.SGD(model.parameters(), lr=0.1))
    trainer.register_hooks([RunHistory(str(tmp_path))])
    with pytest.raises(NonFiniteLossError):
        trainer.train(0, 2)
    assert count_history(tmp_path, "nonfinite_loss") == 1
    assert count_history(tmp_path, "resume") == 0
    event = json.loads((tmp_path / HISTORY_FILE).read_text())
    assert event["iteration"] == 0 and event["rank"] == 0
    assert "non-finite loss at iteration 0" in event["message"]


@pytest.mark.slow
def test_a_taken_metrics_port_stops_megdet_train_with_a_clear_error(shapes, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            train_command(
                shapes, tmp_path / "run",
                "MEGDET.METRICS.PORT", str(port), "SOLVER.MAX_ITER", "4", "SOLVER.STEPS", "(3,)",
                "SOLVER.WARMUP_ITERS", "1",
                workers=None, val=False,
            ),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"megdet train: error: MEGDET.METRICS.PORT: cannot serve on port {port}" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not list((tmp_path / "run").glob("model_*.pth"))  # stopped before training
    # The trainer made its default metrics folder for this port, and took it away again.
    from megdet.trainer.metrics import default_multiproc_dir

    assert not default_multiproc_dir(port).exists()
