"""Each benchmark in its quickest mode: structure and exact counts, never timing."""

from __future__ import annotations

import json
import time

import pytest


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


def _kmock(**options):
    """The controller benchmark's options against kmock (the default is both APIs)."""
    from bench.reconcile.options import Options

    return Options(api="kmock", **options)


def test_every_option_of_the_controller_benchmark_is_a_flag_with_its_default() -> None:
    """The command line is generated from the Options dataclass: a flag per field (its name
    with dashes), the field's default when the flag is left out, switches for bools (a
    --no- form for those on by default) and text parsed into the field's value."""
    import dataclasses
    from pathlib import Path

    from bench.reconcile.options import Options

    assert Options.from_args([], "d") == Options()
    by_dest = {action.dest: action.option_strings for action in Options.parser("d")._actions}
    for f in dataclasses.fields(Options):
        assert by_dest[f.name][0] == "--" + f.name.replace("_", "-"), f.name
    argv = ["--no-heap-trim", "--paced", "--delete", "--rss-after-delete", "0,15"]
    options = Options.from_args([*argv, "--timeout", "30", "--keep-logs", "/tmp/x"], "d")
    assert (options.heap_trim, options.paced, options.rss_after_delete) == (False, True, (0, 15))
    assert options.timeout == 30.0 and options.keep_logs == Path("/tmp/x")
    assert options.apis == ("kmock", "cluster") and Options(api="kmock").apis == ("kmock",)


def test_python_m_bench_runs_the_controller_benchmark_on_kmock_quickly(capsys) -> None:
    from bench.__main__ import main

    main(["--quick", "--only", "controller_reconcile"])
    out = capsys.readouterr().out
    assert "8 MegDetRuns applied at once (burst); APIs: kmock" in out
    assert "kmock: job cache on;" in out


@pytest.mark.parametrize("paced", [False, True], ids=["burst", "paced"])
def test_controller_reconcile_bench_reconciles_every_run_once(paced: bool) -> None:
    from bench import controller_reconcile

    result = controller_reconcile.run(_kmock(runs=4, workers=2, paced=paced))
    assert result["runs"] == 4 and result["paced"] is paced
    assert isinstance(result["status_writes_refused"], int)
    assert result["jobs_created"] == 4  # one job per run, whatever the target
    assert result["reconcile"]["n"] >= 4 and result["apply_to_status"]["n"] == 4
    assert result["pure_part"]["n"] == 4
    assert 0 < result["rss_ready_mib"] <= result["rss_peak_mib"]


def test_the_worker_limit_and_idle_timeout_reach_the_controllers_kopf() -> None:
    """--worker-limit and --idle-timeout (kopf's queueing settings, an experiment of
    docs/capacity.md) are what the controller process's kopf runs with."""
    from bench import controller_reconcile

    result = controller_reconcile.run(_kmock(runs=4, workers=2, worker_limit=50, idle_timeout=0.5))
    assert result["queueing"] == [50, 0.5]
    assert result["tuning"]["worker_limit"] == 50 and result["tuning"]["idle_timeout"] == 0.5
    assert result["jobs_created"] == 4 and result["apply_to_status"]["n"] == 4
    plain = controller_reconcile.run(_kmock(runs=2, workers=2, worker_limit=0, idle_timeout=0.0))
    assert plain["queueing"] == [None, 1.0]  # kopf's no-limit; the benchmark's fast 1 s


def test_the_lean_render_is_on_by_default_and_off_with_no_lean_render() -> None:
    """--no-lean-render (the before side of docs/benchmarks.md's comparison) sends every
    render of the controller process through Helm's schema check; by default each new run's
    values are checked in process and the chart's lean copy renders them."""
    from bench import controller_reconcile

    lean = controller_reconcile.run(_kmock(runs=4, workers=2))
    # The pure part's renders come before the count starts: the burst's 4 are counted.
    assert lean["renders"]["prechecked"] == lean["renders"]["renders"] == 4
    checked = controller_reconcile.run(_kmock(runs=4, workers=2, lean_render=False))
    assert checked["renders"]["renders"] == 4 and checked["renders"]["prechecked"] == 0
    assert checked["jobs_created"] == 4


def test_restart_times_a_new_controller_resuming_every_run() -> None:
    """--restart: a second controller process starts where the runs exist and the benchmark
    waits until it has resumed each one, with a worker limit below the number of runs (the
    start-up kopf's own limit deadlocks on, docs/capacity.md)."""
    from bench import controller_reconcile

    options = _kmock(runs=5, workers=2, restart=True, timeout=60, worker_limit=2)
    result = controller_reconcile.run(options)
    again = result["restart"]
    assert again["reconciles"] >= 5
    assert 0 < again["ready_s"] < again["resumed_s"] and again["resumed_after_ready_s"] > 0
    assert 0 < again["rss_ready_mib"] <= again["rss_peak_mib"]
    with pytest.raises(ValueError, match="choose one"):
        controller_reconcile.run(_kmock(runs=1, delete=True, restart=True))


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--arena-max", "-1"], "--arena-max must be 0"),
        (["--delete", "--restart"], "--delete and --restart: choose one"),
        (["--worker-limit", "-3"], "--worker-limit must be 0"),
        (["--worker-limit", "many"], "--worker-limit: invalid int value"),
        (["--idle-timeout", "-0.5"], "--idle-timeout must be 0"),
        (["--idle-timeout", "nan"], "--idle-timeout must be 0"),
        (["--delete", "--rss-after-delete", "5,soon"], "--rss-after-delete '5,soon': seconds"),
        (["--delete", "--rss-after-delete", "-1"], "--rss-after-delete '-1': seconds"),
        (["--rss-after-delete", "15"], "--rss-after-delete needs --delete"),
        (["--preload", "tcmalloc"], "--preload: invalid choice: 'tcmalloc' (choose from"),
    ],
)
def test_bad_tuning_flags_are_refused_by_name_before_anything_runs(
    argv, named, capsys, monkeypatch
) -> None:
    """The controller benchmark's tuning flags: a bad value is a usage error that names the
    flag and its allowed values (exit 2, no traceback), and nothing is started."""
    from bench import controller_reconcile

    started = []
    monkeypatch.setattr(controller_reconcile, "compare", started.append)
    with pytest.raises(SystemExit) as exit_:
        controller_reconcile.main(["--runs", "2", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    assert started == []  # refused before anything ran


def test_controller_reconcile_bench_deletes_every_run_and_reads_memory_after(capsys) -> None:
    """--delete --tracemalloc: every run deleted (and what it owns, as the garbage collector
    would), the memory read once they are gone, and again at the --rss-after-delete points,
    and tracemalloc's growth by file reported."""
    from bench import controller_reconcile
    from bench.reconcile.driver import DELETE_QUIET_TIMEOUT_S
    from bench.reconcile.memory import MAPPING_KINDS

    options = _kmock(runs=4, workers=2, delete=True, tracemalloc=True, rss_after_delete=(0.0, 1.5))
    started = time.perf_counter()
    result = controller_reconcile.run(options)
    assert time.perf_counter() - started > 1.5  # it waited for the later point
    later = result["rss_after_delete_mib"]
    assert list(later) == ["0", "1.5"] and all(mib > 0 for mib in later.values())
    assert result["delete_s"] is not None and result["delete_s"] > 0
    # The memory is read once the controller process is quiet: nothing in it (the benchmark's
    # own relay thread included) may keep a core busy after the runs are gone.
    assert result["delete_quiet_s"] < DELETE_QUIET_TIMEOUT_S
    assert result["jobs_created"] == 4
    assert 0 < result["rss_ready_mib"] <= result["rss_peak_mib"]
    assert result["rss_reconciled_mib"] > 0 and result["rss_end_mib"] > 0
    kinds = result["rss_by_mapping_mib"]
    assert set(kinds) == {"ready", "end"}
    assert list(kinds["end"]) == list(MAPPING_KINDS)
    # smaps' Rss lines add up to the process's RSS, read a moment apart
    assert abs(sum(kinds["end"].values()) - result["rss_end_mib"]) < 0.1 * result["rss_end_mib"]
    assert kinds["end"]["files (libraries, mapped data)"] > 0
    assert set(result["traced_growth"]) == {"reconciled", "end"}
    assert all(row["file"] and "kib" in row for row in result["traced_growth"]["reconciled"])
    controller_reconcile.print_report(result)
    out = capsys.readouterr().out
    assert "all runs deleted and released in" in out
    assert "RSS 1.5 s after that:" in out
    assert "controller RSS by mapping (/proc smaps), ready -> at the end:" in out
    assert "tracemalloc, ready -> end, largest growth by file:" in out


def test_controller_reconcile_compare_spreads_namespaces_and_reports_ratios(capsys) -> None:
    """kmock for real (4 runs over 2 namespaces); the cluster column is kmock's result with
    made-up request counts, so the side-by-side report and its ratios are checked here without
    a control plane (the real-cluster mode is run by hand, see docs/benchmarks.md)."""
    import copy

    from bench import controller_reconcile
    from bench.reconcile import report

    compared = controller_reconcile.compare(_kmock(runs=4, workers=2, namespaces=2))
    kmock = compared["results"]["kmock"]
    assert kmock["api"] == "kmock" and kmock["namespaces"] == 2
    assert kmock["jobs_created"] == 4 and kmock["apply_to_status"]["n"] == 4
    assert compared["ratios_cluster_over_kmock"] == {}
    assert set(compared["goals"]["kmock"]) >= {"reconcile p99 < 100 ms", "1,000 runs in < 60 s"}
    assert compared["goals"]["kmock"]["1,000 runs in < 60 s"]["met"] is None  # 4 runs

    cluster = copy.deepcopy(kmock)
    cluster["api"] = "cluster"
    cluster["total_s"] = kmock["total_s"] * 2
    cluster.update(
        nodes=4,
        cluster_startup_s=1.0,
        specs_as_kmock=True,
        controller_login="ServiceAccount token (test)",
        api_requests={
            "total": 26,
            "by_verb": {"patch": 12, "create": 9, "get": 5},
            "by_call": {"patch megdetruns/status": 4},
            "by_user_agent": {},
            "non_2xx": {},
        },
        api_requests_per_run={"total": 6.5, "patch": 3.0, "create": 2.25, "get": 1.25},
    )
    results = {"kmock": kmock, "cluster": cluster}
    ratios = report.ratios(results)
    assert ratios["total"] == pytest.approx(2.0)
    assert ratios["controller RSS peak"] == pytest.approx(1.0)
    capsys.readouterr()
    controller_reconcile.print_report(
        {
            "results": results,
            "ratios_cluster_over_kmock": ratios,
            "goals": {api: report.goals(r) for api, r in results.items()},
        }
    )
    out = capsys.readouterr().out
    assert "cluster/kmock" in out and "API requests per run" in out
    assert "2.00" in out.split("total", 1)[1].splitlines()[0]


def test_controller_cluster_counts_the_controllers_requests_from_the_audit_log(tmp_path) -> None:
    from bench.controller_cluster import CONTROLLER_USER, BenchCluster

    bench = BenchCluster(nodes=1, root=tmp_path)
    (tmp_path / "logs").mkdir()

    def event(verb, resource, code, ts, user=CONTROLLER_USER, sub=None, stage="ResponseComplete"):
        ref = {"resource": resource, **({"subresource": sub} if sub else {})}
        return {
            "stage": stage,
            "verb": verb,
            "user": {"username": user},
            "objectRef": ref,
            "responseStatus": {"code": code},
            "userAgent": "megdet-controller/1",
            "requestReceivedTimestamp": ts,
        }

    inside, before = "2026-12-01T10:00:05.000000Z", "2026-12-01T09:59:00.000000Z"
    events = [
        event("get", "pytorchjobs", 404, inside),
        event("create", "pytorchjobs", 201, inside),
        event("patch", "megdetruns", 200, inside, sub="status"),
        event("patch", "megdetruns", 409, inside, sub="status"),
        event("patch", "megdetruns", 200, inside, stage="ResponseStarted"),  # counted once
        event("watch", "megdetruns", 200, before),  # before the window
        event("create", "megdetruns", 201, inside, user="megdet-admin"),  # not the controller
    ]
    (tmp_path / "logs" / "audit.log").write_text("\n".join(json.dumps(e) for e in events))
    import datetime

    start = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.UTC).timestamp()
    counted = bench.controller_requests(start, start + 60)
    assert counted["total"] == 4
    assert counted["by_verb"] == {"patch": 2, "get": 1, "create": 1}
    assert counted["by_call"]["patch megdetruns/status"] == 2
    assert counted["non_2xx"] == {"get pytorchjobs 404": 1, "patch megdetruns/status 409": 1}


def test_a_preload_that_is_not_installed_is_refused_with_its_package(monkeypatch, capsys) -> None:
    from bench import controller_reconcile
    from bench.reconcile import options

    monkeypatch.setattr(options, "_preload_present", lambda soname: False)
    with pytest.raises(SystemExit) as exit_:
        controller_reconcile.main(["--runs", "2", "--preload", "jemalloc"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--preload jemalloc: libjemalloc.so.2 is not installed" in err
    assert "apt-get install libjemalloc2" in err and "Traceback" not in err


def test_the_preloads_are_found_by_the_name_the_loader_is_given() -> None:
    """ldconfig's name for the library is the one LD_PRELOAD gets (libjemalloc2 is installed
    by `make test`: scripts/install_node_packages.sh)."""
    from bench.reconcile.options import PRELOADS, _preload_present

    assert _preload_present(PRELOADS["jemalloc"])
    assert not _preload_present("libnosuchallocator.so.7")
