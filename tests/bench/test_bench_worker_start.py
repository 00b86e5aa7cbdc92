"""bench/worker_start.py: bad options are refused by name; one run of each way really trains
with the way it names (the run's driver prints the start method torch was given)."""

from __future__ import annotations

import pytest

from bench import worker_start


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--repeats", "0"], "--repeats: 0 must be >= 1"),
        (["--iterations", "x"], "--iterations: 'x' is not a whole number"),
    ],
)
def test_bad_options_are_named(argv, said, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        worker_start.main(argv)
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_one_run_each_way_is_timed_with_the_way_it_names(capsys) -> None:
    result = worker_start.run(repeats=1, iterations=1)
    assert [r["method"] for r in result["runs"]] == ["spawn", "fork"]
    # What torch.multiprocessing was asked for, as the run's driver saw it.
    assert [r["started_by"] for r in result["runs"]] == ["spawn", "fork"]
    for run in result["runs"]:
        assert run["wall_s"] > 0 and run["cpu_s"] > 0
    assert set(result["fork_over_spawn"]) == {"wall_s", "cpu_s"}
    worker_start.print_report(result)
    assert "fork / spawn: wall" in capsys.readouterr().out
