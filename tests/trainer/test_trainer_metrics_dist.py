"""On 2 gloo workers: SyncBN health per scope, one /metrics port for both ranks, a taken port.

One pair of processes builds two tiny trainers in turn, as `megdet train` builds them
(load_config, plan_config, build_trainer, build_monitoring_hooks): scope ``none`` without the
exporter, then scope ``backbone`` with it. Rank 0 scrapes its own pod's port at the last step.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from test_trainer_metrics import CONTRACT, samples
from trainer_dist import run_distributed

pytestmark = pytest.mark.slow

ITERATIONS = 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def _scrape_at_last_step(port: int, path: str):
    from detectron2.engine import hooks
    from detectron2.utils import comm

    class ScrapeAtLastStep(hooks.HookBase):
        def after_step(self) -> None:
            if self.trainer.iter + 1 != self.trainer.max_iter:
                return
            comm.synchronize()  # every rank has exported its last step
            if comm.is_main_process():
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as response:
                    Path(path).write_bytes(response.read())
            comm.synchronize()

    return ScrapeAtLastStep()


def _monitoring_worker(
    rank: int, world: int, out: str, shapes: dict, port: int, taken_port: int
) -> None:
    # What the chart's env does for a pod's processes; set here, not in the pytest process,
    # whose prometheus_client (imported by other tests) must stay in single-process mode.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = f"{out}/prom"
    import torch
    from detectron2.utils import comm

    from megdet.trainer.bn_health import SyncBNHealthCheck
    from megdet.trainer.config import ConfigError, load_config, plan_config
    from megdet.trainer.engine import build_trainer
    from megdet.trainer.metrics import build_monitoring_hooks, start_metrics_server
    from megdet.trainer.train import register_datasets

    comm.create_local_process_group(world)  # one "pod" with both ranks
    # Local rank 0 cannot bind: every rank must stop, not only the one that tried.
    try:
        start_metrics_server(taken_port)
        refused = ""
    except ConfigError as err:
        refused = str(err)
    Path(f"{out}/refused{rank}.txt").write_text(refused)
    divergence = {}
    for scope, metrics_port in (("none", 0), ("backbone", port)):
        cfg = load_config(
            "megdet_tiny_cpu",
            ["MEGDET.DATA.TRAIN_JSON", str(shapes["train_json"]),
             "MEGDET.DATA.TRAIN_IMAGES", str(shapes["train_images"]),
             "MEGDET.SYNC_BN", scope, "MEGDET.IMAGES_PER_GPU", "2", "MEGDET.REFERENCE_BATCH", "4",
             "SOLVER.MAX_ITER", str(ITERATIONS), "SOLVER.STEPS", "(3,)",
             "SOLVER.WARMUP_ITERS", "1", "SOLVER.CHECKPOINT_PERIOD", "1000",
             "MEGDET.SYNCBN_CHECK_PERIOD", "2", "MEGDET.METRICS.PORT", str(metrics_port),
             "OUTPUT_DIR", f"{out}/{scope}"],
        )  # fmt: skip
        plan = plan_config(cfg, world, world)
        register_datasets(cfg)
        cfg.freeze()
        torch.manual_seed(rank)
        bundle = build_trainer(cfg, plan, resume=False)
        monitoring = build_monitoring_hooks(cfg, plan, bundle)
        if metrics_port:
            monitoring.append(_scrape_at_last_step(metrics_port, f"{out}/metrics.txt"))
        bundle.trainer.register_hooks(monitoring)
        bundle.trainer.train(0, plan.max_iter)
        check = next(h for h in monitoring if isinstance(h, SyncBNHealthCheck))
        divergence[scope] = check.last
    if rank == 0:
        with open(f"{out}/divergence.json", "w") as f:
            json.dump(divergence, f)


def test_syncbn_divergence_and_one_port_serving_both_ranks(shapes, tmp_path):
    port = _free_port()
    started = time.time()
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        run_distributed(2, _monitoring_worker, str(tmp_path), shapes, port, taken_port)
    for rank in (0, 1):
        assert (
            (tmp_path / f"refused{rank}.txt")
            .read_text()
            .startswith(f"MEGDET.METRICS.PORT: cannot serve on port {taken_port}")
        )

    divergence = json.loads((tmp_path / "divergence.json").read_text())
    print(f"SyncBN divergence after {ITERATIONS} iterations: {divergence}")
    for stat in ("mean", "var"):
        assert divergence["backbone"][stat] < 1e-6, divergence
        # Local BN: running statistics follow each rank's own images.
        assert divergence["none"][stat] > 1e-3, divergence

    assert not list((tmp_path / "prom").glob("*.db"))  # the server's clean-up after training
    text = (tmp_path / "metrics.txt").read_text()
    found = samples(text)
    # Per-rank series: one per rank, from the one port of the pod.
    for name in ("megdet_train_images_total", "megdet_train_iteration_seconds",
                 "megdet_train_data_seconds"):  # fmt: skip
        assert sorted(s.labels["rank"] for s in found[name]) == ["0", "1"], found[name]
    assert {s.labels["rank"]: s.value for s in found["megdet_train_images_total"]} == {
        "0": 2.0 * ITERATIONS,
        "1": 2.0 * ITERATIONS,
    }
    # The fabric: gloo on both ranks, said as such (not NCCL).
    fabric = {s.labels["rank"]: s.labels["transport"] for s in found["megdet_train_fabric_info"]}
    assert fabric == {"0": "gloo", "1": "gloo"}
    # Global series: exactly one each (rank 0's), without rank or pid labels.
    for name, (_, labels) in CONTRACT.items():
        if "rank" in labels or name not in found:
            continue
        label_sets = [s.labels for s in found[name]]
        assert len({json.dumps(x, sort_keys=True) for x in label_sets}) == len(label_sets), name
        assert all(set(x) == labels for x in label_sets), (name, label_sets)
    assert all("pid" not in s.labels for series in found.values() for s in series)
    assert found["megdet_train_iteration"][0].value == ITERATIONS
    assert [s.labels for s in found["megdet_train_run_info"]] == [
        {"world_size": "2", "sync_bn": "backbone", "bn_group_size": "2", "global_batch": "4"}
    ]
    assert found["megdet_train_world_size"][0].value == 2  # two processes, one node
    assert found["megdet_train_nodes"][0].value == 1
    assert {s.labels["component"] for s in found["megdet_train_loss"]} == {
        "loss_cls", "loss_box_reg", "loss_rpn_cls", "loss_rpn_loc", "total",
    }  # fmt: skip
    exported = {s.labels["stat"]: s.value for s in found["megdet_syncbn_divergence"]}
    assert exported == pytest.approx(divergence["backbone"], abs=0)
    lr = found["megdet_train_learning_rate"][0].value
    assert lr == pytest.approx(found["megdet_train_planned_learning_rate"][0].value)
    assert started < found["megdet_train_last_checkpoint_timestamp_seconds"][0].value < time.time()
    # Everything the contract names is there, except GPU memory (CPU) and AP (no evaluation).
    missing = set(CONTRACT) - set(found)
    assert missing == {"megdet_train_gpu_memory_max_bytes", "megdet_eval_ap"}

    from tests.prometheus_harness import promtool

    # promtool is unpacked by `make test`'s set-up; a missing one is an error, never a skip.
    lint = promtool("check", "metrics", stdin=text)
    assert lint.returncode == 0 and not lint.stdout and not lint.stderr, lint
