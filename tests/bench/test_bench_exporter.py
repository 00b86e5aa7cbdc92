"""bench/exporter_overhead.py in its quickest mode: structure and call counts, never timing."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_exporter_overhead_alternates_the_conditions_and_times_the_hook_and_a_scrape(
    capsys,
) -> None:
    from bench import exporter_overhead

    result = exporter_overhead.run(quick=True)
    assert result["world_size"] == 2 and result["images_per_process"] == 1
    assert (result["rounds"], result["block"], result["warmup"]) == (1, 1, 0)
    for name in exporter_overhead.CONDITIONS:
        # One block per round, its wall and CPU time per step, for each condition.
        assert result["step_s"][name]["n"] == result["rounds"]
        assert result["cpu_s"][name]["n"] == result["rounds"]
        assert result["cpu_s"][name]["median"] > 0
    assert result["ratio_with_to_without"]["n"] == result["rounds"]
    # A smoke run times 3 calls: the hook 10 times as often, one scrape served by local rank 0.
    assert result["hook_after_step_s"]["n"] == 30
    assert result["scrape_s"]["n"] == 3
    tiny = result["check"]["tiny"]
    assert tiny["layers"] > 0 and tiny["check_s"]["n"] == 3
    assert result["check"]["R50-FPN"] is None  # built only outside --quick
    exporter_overhead.print_report(result)
    out = capsys.readouterr().out
    assert out.startswith("Exporter overhead: 2 gloo processes x ")
    assert "1 rounds x 1 steps per condition after 0 warm-up steps" in out
    assert "(smoke run: unwarmed single steps, not a measurement)" in out
