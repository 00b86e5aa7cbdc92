"""bench/busy_threads.py: bad options are refused by name; one pair of each way trains with the
threads it names (each run's driver prints what torch trains with) and reports its speed."""

from __future__ import annotations

import pytest

from bench import busy_threads


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--rounds", "0"], "--rounds: 0 must be >= 1"),
        (["--iterations", "two"], "--iterations: 'two' is not a whole number"),
        (["--iterations", "3"], "--iterations: 3 must be >= 4"),
    ],
)
def test_bad_options_are_named(argv, said, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        busy_threads.main(argv)
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_one_pair_each_way_trains_on_the_threads_it_names(monkeypatch, capsys) -> None:
    # Two threads against one wherever this runs (CI has 2 cores; torch's default is that), one
    # run at a time: the pair's contention is the measurement, not what this checks.
    monkeypatch.setattr(busy_threads, "ways", lambda: {"default": 2, "one": 1})
    result = busy_threads.run(rounds=1, iterations=busy_threads.MIN_ITERATIONS, pair=1)
    assert [(p["way"], p["threads"]) for p in result["pairs"]] == [("default", 2), ("one", 1)]
    for pair in result["pairs"]:
        assert len(pair["s_per_iter"]) == 1
        assert all(s > 0 for s in pair["s_per_iter"])
        assert pair["wall_s"] > 0 and pair["cpu_s"] > 0
    assert set(result["one_over_default"]) == {"s_per_iter", "wall_s", "cpu_s"}
    busy_threads.print_report(result)
    assert "one / default: s/it" in capsys.readouterr().out
