"""bench/busy_threads.py: bad options are refused by name; the driver trains with the threads
each way names (it prints what torch has); a run at one thread trains and is reported."""

from __future__ import annotations

import subprocess
import sys

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


def test_the_driver_reports_the_threads_each_way_gives_torch() -> None:
    # Only the driver's first line (``train --help`` trains nothing): at 2 threads a training
    # run on the suite's busy cores costs what the bench measures.
    for threads in (2, 1):
        done = subprocess.run(
            [sys.executable, "-c", busy_threads.DRIVER, "train", "--help"],
            capture_output=True, text=True, timeout=120, env=busy_threads.thread_env(threads),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"{busy_threads.THREADS}{threads}" in done.stderr.splitlines()


def test_a_pair_at_one_thread_trains_and_is_reported(monkeypatch, capsys) -> None:
    monkeypatch.setattr(busy_threads, "ways", lambda: {"one": 1})
    result = busy_threads.run(rounds=1, iterations=busy_threads.MIN_ITERATIONS, pair=1)
    (pair,) = result["pairs"]
    assert (pair["way"], pair["threads"]) == ("one", 1)
    assert len(pair["s_per_iter"]) == 1 and pair["s_per_iter"][0] > 0
    assert pair["wall_s"] > 0 and pair["cpu_s"] > 0
    assert set(result["medians"]) == {"one"} and result["one_over_default"] == {}
    busy_threads.print_report(result)
    assert "median one" in capsys.readouterr().out
