"""bench/progress_overhead.py in its quickest mode: structure and post counts, never timing."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_progress_overhead_runs_every_loop_and_the_reporters_really_post() -> None:
    from bench import progress_overhead

    result = progress_overhead.run(quick=True)
    assert result["world_size"] == 2
    assert set(result["step_s"]) == set(progress_overhead.LOOPS)
    for name in progress_overhead.LOOPS:
        assert result["step_s"][name]["n"] == result["rounds"]
    assert result["ratio_to_simple"]["simple"]["median"] == 1.0
    posts = result["posts"]
    # The start report at least reached the accepting server; every post to the closed port
    # failed; the server counted what the rank-0 posters say they delivered (the directly
    # timed posts included).
    assert posts["progress"]["accepted"] >= 1 and posts["progress"]["failed"] == 0
    assert posts["progress-every-step"]["accepted"] >= 1
    assert posts["unreachable"]["accepted"] == 0 and posts["unreachable"]["failed"] >= 1
    delivered = posts["progress"]["accepted"] + posts["progress-every-step"]["accepted"]
    assert posts["progress-every-step"]["accepted"] >= result["direct"]["one_post_s"]["n"]
    assert result["server_posts"] == delivered
