"""bench/progress_endpoint.py in its quickest mode: structure and counts, never timing."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_progress_endpoint_bench_floods_slows_and_reconciles() -> None:
    from bench import progress_endpoint

    result = progress_endpoint.run(quick=True)
    (after,) = result["trees"].values()
    flood = result["params"]["flood"]
    # Every flood request was answered, 404 (its name is longer than Kubernetes allows), and
    # the endpoint kept nothing of any of them.
    assert after["flood"]["answers"] == {"404": flood}
    assert after["flood_end"]["logged"] == 0 and after["flood_end"]["cached"] == 0
    assert after["flood_end"]["hub_runs"] == 0
    # Real reporters were served alone and during both attacks; the runs were reconciled.
    for phase in ("alone", "one_source", "many_sources"):
        assert after[phase]["answers"].get("200", 0) > 0, phase
    for phase in ("one_source", "many_sources"):
        assert after[phase]["reconcile_s"] > 0
    # From one address, the attack holds at most its per-source share; the rest is cut.
    assert after["one_source"]["slow_reconnects"] > 0
