"""What the controller's pure part costs per MegDetRun: render, validation, CEL.

Side by side in one process, interleaved so that drift on the machine hits every case alike:

- ``render_run`` for a new run (the chart loaded once, one Helm render), and the same render
  with the chart loaded for every run;
- ``plan_children`` for a new run: a reconcile's whole pure part (the operator's values
  refused, one render, owner references);
- ``validate_run`` for a new run (schema, CEL, plan, owned overrides, a chart render): what
  ``megdet validate`` runs offline, and what a reconcile ran before its render;
- the CEL layer alone with the controller's implementation (common-expression-language, Rust)
  and with cel-python, on the same rules and the same defaulted specs.

Specs: the three examples/ runs (8, 16 and 64 GPUs), defaulted as the API server would.
Reports median, p90 and p99 per case and ratios of medians.

    .venv/bin/python -m bench.controller_validation [--repeats 200] [--json]
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import celpy
import helm_python
import yaml

from bench import harness
from megdet.api.schema import cel_problems, coerce_numbers, rule_sites
from megdet.api.validation import crd_spec_schema, default_spec, validate_run
from megdet.controller.planning import plan_children
from megdet.controller.render import chart_dir, render_run

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _summary(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "median_ms": statistics.median(samples) * 1e3,
        "p90_ms": _percentile(samples, 0.9) * 1e3,
        "p99_ms": _percentile(samples, 0.99) * 1e3,
        "max_ms": max(samples) * 1e3,
    }


_CELPY = celpy.Environment()


@functools.cache
def _celpy_program(rule: str) -> Any:
    return _CELPY.program(_CELPY.compile(rule))


def _cel_python_layer(schema: dict[str, Any], spec: dict[str, Any]) -> int:
    """The CEL layer evaluated with cel-python: same rules, same bindings; failures counted."""
    failed = 0
    for node, value, _old, _parts in rule_sites(schema, coerce_numbers(schema, spec), None, []):
        bound = {"self": celpy.json_to_cel(value)}
        for rule in node["x-kubernetes-validations"]:
            if "oldSelf" in rule["rule"]:
                continue
            try:
                failed += not bool(_celpy_program(rule["rule"]).evaluate(bound))
            except celpy.CELEvalError:
                failed += 1
    return failed


def _load_and_render(name: str, spec: dict[str, Any]) -> None:
    with helm_python.Chart.load(str(chart_dir())) as chart:
        chart.render(
            values={**spec, "fullnameOverride": name}, name=name, namespace="ns", is_install=True
        )


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _planned(name: str, spec: dict[str, Any]) -> float:
    """A reconcile's pure part for a new run (a uid, so owner references are written)."""
    run = {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": spec,
    }
    return _timed(lambda: plan_children(run))


def run(repeats: int = 200, warmup: int = 5) -> dict[str, Any]:
    """Time every case ``repeats`` times, interleaved; each iteration uses new run names."""
    runs = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
    specs = [(r["metadata"]["name"], default_spec(r["spec"])) for r in runs]
    schema = crd_spec_schema()
    cases: dict[str, Callable[[int], float]] = {
        "render_run, new run (one Helm render)": lambda i: _timed(
            lambda: render_run(f"{_at(specs, i)[0]}-r{i}", "ns", _at(specs, i)[1])
        ),
        "render, chart loaded per run": lambda i: _timed(
            lambda: _load_and_render(f"{_at(specs, i)[0]}-l{i}", _at(specs, i)[1])
        ),
        "validate_run, new run (all layers)": lambda i: _timed(
            lambda: validate_run(_at(specs, i)[1], name=f"{_at(specs, i)[0]}-v{i}")
        ),
        "plan_children, new run (a reconcile's pure part)": lambda i: _planned(
            f"{_at(specs, i)[0]}-p{i}", _at(specs, i)[1]
        ),
        "CEL layer, common-expression-language": lambda i: _timed(
            lambda: cel_problems(schema, _at(specs, i)[1])
        ),
        "CEL layer, cel-python": lambda i: _timed(
            lambda: _cel_python_layer(schema, _at(specs, i)[1])
        ),
    }
    for i in range(warmup):
        for case in cases.values():
            case(-1 - i)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(repeats):
        for name, case in cases.items():
            samples[name].append(case(i))
    result = {name: _summary(values) for name, values in samples.items()}
    median = {name: r["median_ms"] for name, r in result.items()}
    return {
        "machine": platform.platform(),
        "specs": [name for name, _ in specs],
        "cases": result,
        "ratios": {
            "chart loaded per run / render_run": median["render, chart loaded per run"]
            / median["render_run, new run (one Helm render)"],
            "validate_run / plan_children": median["validate_run, new run (all layers)"]
            / median["plan_children, new run (a reconcile's pure part)"],
            "cel-python / common-expression-language": median["CEL layer, cel-python"]
            / median["CEL layer, common-expression-language"],
        },
    }


def _at(items: list[Any], i: int) -> Any:
    return items[i % len(items)]


def print_report(result: dict[str, Any]) -> None:
    print(f"controller validation and render, per run ({result['machine']})")
    print(f"specs: {', '.join(result['specs'])}")
    width = max(len(name) for name in result["cases"])
    print(f"{'case'.ljust(width)}  {'n':>5} {'median':>9} {'p90':>9} {'p99':>9} {'max':>9}  (ms)")
    for name, r in result["cases"].items():
        print(
            f"{name.ljust(width)}  {r['n']:>5} {r['median_ms']:>9.3f} {r['p90_ms']:>9.3f} "
            f"{r['p99_ms']:>9.3f} {r['max_ms']:>9.3f}"
        )
    for name, ratio in result["ratios"].items():
        print(f"ratio of medians, {name}: {ratio:.1f}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(repeats=args.repeats)
    harness.emit(result, args.json, print_report)


if __name__ == "__main__":
    main()
