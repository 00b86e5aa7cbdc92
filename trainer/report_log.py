"""Rank 0's ``log.txt`` read for a run's report (trainer/report.py): attempts and wall time.

Every attempt of a run appends to the same ``log.txt``. An attempt starts with the output
folder's claim and the plan (trainer/train.py); within it, the report reads the log's
timestamps (one-second resolution; detectron2's format has no year) and detectron2's own timing
lines, whose format detectron2 keeps for scripts that grep them:

* ``detectron2/engine/train_loop.py``: "Starting training from iteration N";
* ``detectron2/engine/hooks.py`` ``IterationTimer.after_train``: "Overall training speed: N
  iterations in H:MM:SS (S s / it)" (the loop without hooks, leaving out each attempt's first
  3 iterations) and "Total training time: H:MM:SS (H:MM:SS on hooks)";
* ``detectron2/evaluation/evaluator.py`` ``inference_on_dataset``: "Total inference time: ...".

The fabric is the "Fabric: ..." line trainer/fabric.py logs; how an attempt ended, from the
SIGTERM and non-finite-loss lines of trainer/engine.py.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

__all__ = ["read_attempts", "wall_time"]


_LINE = re.compile(r"^\[(\d\d)/(\d\d) (\d\d):(\d\d):(\d\d)\] (\S+) (\w+): (.*)$")
_DURATION = re.compile(r"(?:(\d+) days?, )?(\d+):(\d\d):(\d\d(?:\.\d+)?)")
_PLAN_KEY = re.compile(r"^  (\w+): (.*)$")
#: What rank 0 logs at the start of each attempt (trainer/train.py ``_print_plan``).
_ATTEMPT = "Plan for the world this run found:"
_STARTING = re.compile(r"Starting training from iteration (\d+)")
_SPEED = re.compile(r"Overall training speed: (\d+) iterations in .* \(([\d.]+) s / it\)")
_TOTAL = re.compile(r"Total training time: (.+) \((.+) on hooks\)")
_INFERENCE = re.compile(r"Total inference time: (.+?) \(")
_FABRIC = re.compile(r"^Fabric: .*")
_ENDINGS = (
    ("SIGTERM", re.compile(r"after SIGTERM")),
    ("non-finite loss", re.compile(r"non-finite loss at iteration")),
)


def _seconds(text: str) -> float | None:
    match = _DURATION.fullmatch(text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


#: (time, logger, level, message, continuation lines) of one timestamped line of the log.
Record = tuple[datetime, str, str, str, list[str]]


def _log_records(path: Path) -> list[Record]:
    """The log's records. detectron2's log format has no year: a time far before the previous
    one is read as the next year."""
    records: list[Record] = []
    year = 2000  # a leap year, so that 02/29 reads
    for line in path.read_text(errors="replace").splitlines():
        match = _LINE.match(line)
        if not match:
            if records:
                records[-1][4].append(line)
            continue
        month, day, hour, minute, second = (int(g) for g in match.groups()[:5])
        try:
            when = datetime(year, month, day, hour, minute, second)
        except ValueError:
            continue
        if records and when < records[-1][0] - timedelta(days=180):
            year += 1
            when = when.replace(year=year)
        records.append((when, match.group(6), match.group(7), match.group(8), []))
    return records


def _attempt(records: list[Record]) -> dict[str, Any]:
    """One attempt's facts from its log records."""
    first, last = records[0][0], records[-1][0]
    out: dict[str, Any] = {
        "started": first.strftime("%m/%d %H:%M:%S"),
        "start_iter": None,
        "world_size": None,
        "global_batch": None,
        "fabric": None,
        "ended": None,
        "wall_s": (last - first).total_seconds(),
        "setup_s": None,
        "steps_s": None,
        "timed_iters": None,
        "hooks_s": None,
        "after_loop_s": None,
        "evaluation_s": None,
    }
    loop_start = loop_end = None
    for when, _, _, message, more in records:
        if message == _ATTEMPT:
            for extra in more:
                key = _PLAN_KEY.match(extra)
                if key and key.group(1) in ("world_size", "global_batch"):
                    out[key.group(1)] = int(key.group(2))
        elif match := _STARTING.search(message):
            out["start_iter"] = int(match.group(1))
            out["setup_s"] = (when - first).total_seconds()
            loop_start = when
        elif match := _SPEED.search(message):
            out["timed_iters"] = int(match.group(1))
            out["steps_s"] = int(match.group(1)) * float(match.group(2))
        elif match := _TOTAL.search(message):
            total, hooks = _seconds(match.group(1)), _seconds(match.group(2))
            out["hooks_s"] = hooks
            loop_end = when
            out["loop_s"] = total
        elif match := _INFERENCE.search(message):
            out["evaluation_s"] = (out["evaluation_s"] or 0.0) + (_seconds(match.group(1)) or 0.0)
        elif _FABRIC.match(message):
            out["fabric"] = message
        for ending, pattern in _ENDINGS:
            if pattern.search(message):
                out["ended"] = ending
    if loop_end is not None:
        out["after_loop_s"] = (last - loop_end).total_seconds()
        if loop_start is not None and out.get("loop_s") is not None:
            # detectron2 leaves its first iterations of each attempt out of its timers.
            span = (loop_end - loop_start).total_seconds()
            out["untimed_s"] = max(0.0, span - out["loop_s"])
    out.pop("loop_s", None)
    return out


def read_attempts(path: Path) -> list[dict[str, Any]]:
    """The attempts recorded in rank 0's log, in order (empty without a log); OSError if the
    log cannot be read."""
    if not path.is_file():
        return []
    records = _log_records(path)
    starts = [n for n, r in enumerate(records) if r[3] == _ATTEMPT]
    # The line before the plan, from the same logger, is the attempt's first: the output
    # folder's claim (trainer/ownership.py).
    starts = [n - 1 if n and records[n - 1][1:3] == records[n][1:3] else n for n in starts]
    if not starts:
        starts = [n for n, r in enumerate(records) if _STARTING.search(r[3])][:1]
    if not starts:
        return []
    return [_attempt(records[a:b]) for a, b in pairwise([*starts, len(records)])]


#: The wall-time parts of an attempt, summed over attempts by :func:`wall_time`.
PARTS = ("wall_s", "setup_s", "untimed_s", "steps_s", "hooks_s", "after_loop_s", "evaluation_s")


def wall_time(attempts: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each part summed over the attempts that recorded it (``total_s``: the attempts' wall
    time); None for a part no attempt recorded."""
    out: dict[str, float | None] = {}
    for key in PARTS:
        values = [a[key] for a in attempts if a.get(key) is not None]
        out["total_s" if key == "wall_s" else key] = sum(values) if values else None
    return out
