"""RunLocks: one status writer at a time per run, runs independent, nothing kept per run."""

from __future__ import annotations

import threading
import time

import pytest

from megdet.controller.status_writer import RunLocks, changed_fields


def _hold(locks: RunLocks, key: tuple[str, str], spans: list, entered: threading.Event) -> None:
    with locks.hold(key):
        start = time.monotonic()
        entered.set()
        time.sleep(0.2)
        spans.append((key, start, time.monotonic()))


def _run_two(locks: RunLocks, first: tuple[str, str], second: tuple[str, str]) -> list:
    spans: list = []
    entered = threading.Event()
    a = threading.Thread(target=_hold, args=(locks, first, spans, entered))
    a.start()
    assert entered.wait(5)
    b = threading.Thread(target=_hold, args=(locks, second, spans, threading.Event()))
    b.start()
    a.join(5)
    b.join(5)
    return sorted(spans, key=lambda s: s[1])


def test_one_runs_holders_take_turns() -> None:
    locks = RunLocks()
    (_, _, first_end), (_, second_start, _) = _run_two(locks, ("ns", "r"), ("ns", "r"))
    assert second_start >= first_end


def test_two_runs_do_not_wait_for_each_other() -> None:
    locks = RunLocks()
    (_, _, first_end), (_, second_start, _) = _run_two(locks, ("ns", "a"), ("ns", "b"))
    assert second_start < first_end


def test_no_lock_is_kept_once_its_run_is_done() -> None:
    locks = RunLocks()
    for i in range(100):
        with locks.hold(("ns", f"r{i}")):
            assert len(locks) == 1
    assert len(locks) == 0
    with pytest.raises(RuntimeError), locks.hold(("ns", "boom")):
        raise RuntimeError("a handler failed")
    assert len(locks) == 0


def test_only_changed_fields_are_written() -> None:
    old = {"phase": "Running", "restarts": 1, "conditions": [{"type": "Valid"}]}
    new = {"phase": "Running", "restarts": 2, "conditions": [{"type": "Valid"}], "jobName": "r"}
    assert changed_fields(old, new) == {"restarts": 2, "jobName": "r"}
    assert changed_fields(old, dict(old)) == {}
