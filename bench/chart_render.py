"""Render time of the megdet chart with the real Helm engine (helm-python-sdk).

Renders the 64-GPU case (8 pods, InfiniBand, gang scheduling) and, side by side in the same
process and the same loop, the 1-GPU default case, many times each, interleaved so that drift
on the machine hits both alike. Reports median and spread (p10, p90, min, max) per case and the
64-GPU/1-GPU ratio of medians. Chart loading is timed separately (once per `helm install`).

    .venv/bin/python bench/chart_render.py [--repeats 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import helm_python

CHART = Path(__file__).resolve().parents[1] / "charts" / "megdet"

CASES: dict[str, dict[str, Any]] = {
    "gpus=64 (8 pods, IB, gang)": {
        "gpus": 64,
        "nccl": {
            "ib": {"enabled": True, "rdmaResourceName": "rdma/rdma_shared_device_a", "hca": "mlx5"}
        },
        "gang": {"enabled": True},
    },
    "gpus=1 (defaults otherwise)": {"gpus": 1},
}


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def summarize(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "n": len(s),
        "median_ms": statistics.median(s) * 1e3,
        "p10_ms": percentile(s, 0.10) * 1e3,
        "p90_ms": percentile(s, 0.90) * 1e3,
        "min_ms": s[0] * 1e3,
        "max_ms": s[-1] * 1e3,
    }


def run(repeats: int, warmup: int = 10) -> dict[str, Any]:
    load_times = []
    for _ in range(20):
        start = time.perf_counter()
        chart = helm_python.Chart.load(str(CHART))
        load_times.append(time.perf_counter() - start)
        chart.close()

    samples: dict[str, list[float]] = {name: [] for name in CASES}
    with helm_python.Chart.load(str(CHART)) as chart:
        for i in range(warmup + repeats):
            for name, values in CASES.items():
                start = time.perf_counter()
                out = chart.render(values=values, name="megdet", namespace="ml", is_install=True)
                elapsed = time.perf_counter() - start
                assert "megdet/templates/pytorchjob.yaml" in out
                if i >= warmup:
                    samples[name].append(elapsed)

    results = {name: summarize(s) for name, s in samples.items()}
    big, small = (results[name]["median_ms"] for name in CASES)
    return {
        "engine": f"helm-python-sdk (Helm SDK {helm_python.helm_sdk_version()})",
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {platform.processor() or 'unknown cpu'}",
        "repeats": repeats,
        "chart_load": summarize(load_times),
        "render": results,
        "ratio_64_to_1_gpu_median": big / small,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = parser.parse_args()
    result = run(args.repeats)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['engine']}, Python {result['python']}, {args.repeats} renders per case")
    load = result["chart_load"]
    print(f"Chart.load: median {load['median_ms']:.2f} ms (p10 {load['p10_ms']:.2f}, ", end="")
    print(f"p90 {load['p90_ms']:.2f}, n={load['n']})")
    for name, r in result["render"].items():
        print(
            f"render {name}: median {r['median_ms']:.2f} ms, p10 {r['p10_ms']:.2f}, "
            f"p90 {r['p90_ms']:.2f}, min {r['min_ms']:.2f}, max {r['max_ms']:.2f}"
        )
    print(f"64-GPU / 1-GPU median ratio: {result['ratio_64_to_1_gpu_median']:.2f}")


if __name__ == "__main__":
    main()
