"""Each benchmark in its quickest mode: structure and exact counts, never timing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `bench/` is a top-level folder, not an installed package
    sys.path.insert(0, str(ROOT))


def _expected_bn_layout(overrides: tuple[str, ...]) -> dict[str, object]:
    """BN layers and trainable parameters of the model, counted here from a fresh build."""
    import torch
    from detectron2.modeling import build_model

    from megdet.trainer.config import load_config

    cfg = load_config("megdet_tiny_cpu", list(overrides))
    model = build_model(cfg)

    def bns(root: torch.nn.Module) -> list[int]:
        return [m.num_features for m in root.modules() if isinstance(m, torch.nn.BatchNorm2d)]

    params = [p for p in model.parameters() if p.requires_grad]
    return {
        "backbone": bns(model.backbone.bottom_up),
        "all": bns(model),
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
    }


@pytest.mark.slow
def test_sync_bn_scope_counts_are_exact_per_layer_and_scope() -> None:
    from bench import harness, sync_bn_scope

    result = sync_bn_scope.run(quick=True)
    assert result["world_size"] == 2
    counts = result["counts"]["tiny+normed-heads"]
    expected = _expected_bn_layout(harness.TINY_NORMED_HEADS)
    layers = {"none": [], "backbone": expected["backbone"], "all": expected["all"]}
    # The normed-heads model has BN outside the backbone, so the scopes are strictly nested.
    assert 0 < len(layers["backbone"]) < len(layers["all"])

    for scope, channels in layers.items():
        c = counts[scope]
        calls, size = c["per_iteration"]["calls"], c["per_iteration"]["bytes"]
        assert c["sync_bn_layers"] == len(channels), scope
        assert c["constant_after_first"], scope
        # One all-reduce of (mean, mean of squares) per synchronized layer, each direction.
        assert calls["bn_forward"] == calls["bn_backward"] == len(channels), scope
        assert size["bn_forward"] == size["bn_backward"] == 2 * 4 * sum(channels), scope
        # Every trainable parameter's gradient is all-reduced once per step, in DDP buckets.
        assert size["grad_allreduce"] == expected["param_bytes"], scope
        assert calls["grad_allreduce"] >= 1
        assert calls["stop_signal"] == 1 and calls["metrics"] == 1 and calls["other"] == 0

    bn_calls = [
        counts[s]["per_iteration"]["calls"]["bn_forward"] for s in ("none", "backbone", "all")
    ]
    assert bn_calls[0] < bn_calls[1] < bn_calls[2]
    grad = {counts[s]["per_iteration"]["bytes"]["grad_allreduce"] for s in counts}
    assert len(grad) == 1  # the scope changes BN traffic only

    timing = result["timing"]
    assert set(timing["step_s"]) == set(sync_bn_scope.SCOPES)
    assert all(timing["step_s"][s]["n"] == timing["rounds"] for s in sync_bn_scope.SCOPES)
    assert timing["ratio_to_none"]["none"]["median"] == 1.0


@pytest.mark.slow
def test_step_overhead_runs_three_loops_on_the_built_trainer() -> None:
    from bench import step_overhead

    result = step_overhead.run(quick=True)
    assert result["world_size"] == 2
    assert result["sync_bn"] == "backbone"
    assert result["sync_bn_layers"] == len(_expected_bn_layout(())["backbone"])
    assert "StopOnSignal" in result["hooks"] and "LRScheduler" in result["hooks"]
    assert set(result["step_s"]) == set(step_overhead.LOOPS)
    for name in step_overhead.LOOPS:
        assert result["step_s"][name]["n"] == result["rounds"]
        assert result["step_s"][name]["median"] > 0
    assert result["ratio_to_simple"]["simple"]["median"] == 1.0
    assert result["ratio_of_step_medians"]["simple"] == 1.0


def test_data_throughput_reports_loader_and_model_rates() -> None:
    from bench import data_throughput

    result = data_throughput.run(quick=True)
    assert result["world_size"] == 1
    assert result["dataloader_workers"] == 0  # what megdet_tiny_cpu configures
    for key in ("loader_images_per_s", "step_images_per_s", "model_images_per_s"):
        assert result[key]["n"] == result["rounds"]
        assert result[key]["median"] > 0
    # The model-only rate excludes the data wait, so it is never below the step's rate.
    assert result["model_images_per_s"]["min"] >= result["step_images_per_s"]["min"]
    assert 0 <= result["data_wait_share_of_step"]["median"] < 1


def test_gpu_step_cpu_smoke_runs_every_scope(tmp_path, capsys) -> None:
    from bench import gpu_step

    out = tmp_path / "gpu.json"
    args = ["--device", "cpu", "--tiny", "--images-per-gpu", "1", "--json", str(out)]
    assert gpu_step.main(args) == 0
    result = json.loads(out.read_text())
    # Every scope with our trainer, plus detectron2's SimpleTrainer on the backbone model.
    assert [(r["trainer"], r["scope"], r["amp"]) for r in result["rows"]] == [
        ("megdet", "none", False),
        ("megdet", "backbone", False),
        ("detectron2", "backbone", False),
        ("megdet", "all", False),
    ]
    assert result["world_size"] == 1 and result["image_size"] == [128, 128]
    # At world 1 there is no one to synchronize with: no layer is converted.
    assert all(r["sync_bn_layers"] == 0 for r in result["rows"])
    assert all(r["step_s"]["n"] == 1 and r["images_per_s_per_gpu"] > 0 for r in result["rows"])
    assert "images/s/GPU" in capsys.readouterr().out


def test_gpu_step_without_cuda_exits_2_with_a_message(monkeypatch, capsys) -> None:
    import torch

    from bench import gpu_step

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_step.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert gpu_step.main(["--device", "cpu"]) == 2
    assert "--device cpu needs --tiny" in capsys.readouterr().err


def test_python_m_bench_runs_the_chart_benchmark_quickly(capsys) -> None:
    from bench.__main__ import main

    main(["--quick", "--only", "chart_render"])
    out = capsys.readouterr().out
    assert "== chart_render ==" in out
    assert "20 renders per case" in out


@pytest.mark.parametrize("paced", [False, True], ids=["burst", "paced"])
def test_controller_reconcile_bench_reconciles_every_run_once(paced: bool) -> None:
    from bench import controller_reconcile

    result = controller_reconcile.run(runs=4, workers=2, paced=paced)
    assert result["runs"] == 4 and result["paced"] is paced
    assert isinstance(result["status_writes_refused"], int)
    assert result["jobs_created"] == 4  # one job per run, whatever the target
    assert result["reconcile"]["n"] >= 4 and result["apply_to_status"]["n"] == 4
    assert result["pure_part"]["n"] == 4
    assert 0 < result["rss_ready_mib"] <= result["rss_peak_mib"]
