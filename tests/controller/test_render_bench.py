"""Smoke test of bench/controller_validation.py: every case runs and is reported."""

from __future__ import annotations

from bench import controller_validation


def test_controller_validation_bench_runs_every_case(capsys):
    result = controller_validation.run(repeats=3, warmup=1)
    assert set(result["cases"]) == {
        "render_run, new run (one Helm render)",
        "render, chart loaded per run",
        "validate_run, new run (all layers)",
        "plan_children, new run (a reconcile's pure part)",
        "CEL layer, common-expression-language",
        "CEL layer, cel-python",
    }
    assert all(case["n"] == 3 and case["median_ms"] > 0 for case in result["cases"].values())
    assert all(ratio > 0 for ratio in result["ratios"].values())
    controller_validation.print_report(result)
    assert "ratio of medians, cel-python / common-expression-language" in capsys.readouterr().out
