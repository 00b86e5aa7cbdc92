"""A run's report, from its output folder alone: what the run did, kept after its pods are gone.

:func:`build_report` reads the files the trainer leaves in ``OUTPUT_DIR`` (docs/trainer.md,
"Output folder") and returns plain JSON-able data:

* ``plan.json``: the plan, and its ``segments`` when the run changed size (without them, one
  segment from the plan's own keys);
* ``metrics.json``: the final box AP and AP50;
* ``events.jsonl`` (detectron2's ``JSONWriter``): the loss, learning-rate and AP curves and the
  iterations done, each point placed at the images seen through its segment's global batch
  (iteration numbers restart when a resized run changes its global batch);
* ``log.txt`` (rank 0's log, appended by every attempt): the attempts, how each ended, the
  fabric each used and the wall time by part, from the log's timestamps and detectron2's own
  timing lines (``detectron2/engine/hooks.py`` ``IterationTimer.after_train``,
  ``detectron2/evaluation/evaluator.py`` ``inference_on_dataset``).

:func:`write_report` saves it as ``report.json`` and ``report.html`` (trainer/report_page.py).
Nothing here imports torch: `megdet report` works in any install.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from megdet.trainer.report_log import read_attempts, wall_time

__all__ = [
    "ReportError",
    "build_report",
    "read_events",
    "report_json",
    "report_totals",
    "write_report",
]

PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.json"
EVENTS_FILE = "events.jsonl"
LOG_FILE = "log.txt"
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
#: report.json's layout version; raised when a key changes meaning or goes away.
REPORT_FORMAT = 1
#: A segment's keys that the report computes with (whole numbers, required) ...
SEGMENT_NUMBERS = ("global_batch", "first_iter", "images_start")
#: ... and those it shows (None when absent; any other key is kept as it is). ``last_iter`` is
#: inclusive; ``resize`` is how a continuation chose its batch (trainer/elastic.py).
SEGMENT_KEYS = (
    "world_size", "global_batch", "accumulation_steps", "lr", "resize", "first_iter",
    "last_iter", "images_start", "images_end",
)  # fmt: skip
#: The fabric a run used is "not recorded" unless its log has the fabric line.
NOT_RECORDED = "not recorded"
#: How an attempt ended when its log says nothing: killed, crashed, or still running.
NO_END = "no end recorded (killed, crashed or still running)"


class ReportError(ValueError):
    """A folder or file that cannot be reported on; the message names the file."""


# --- reading the files -----------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as err:
        raise ReportError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_plan(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The plan summary (top-level keys) and the run's segments."""
    plan = _read_json(path)
    if not isinstance(plan, dict):
        raise ReportError(f"{path}: expected a JSON object (the plan summary)")
    for key in ("world_size", "global_batch", "max_iter"):
        if not _whole(plan.get(key)):
            raise ReportError(f"{path}: {key!r} missing or not a whole number")
    raw = plan.get("segments")
    if raw is None:
        # A plan.json without segments (a trainer before them): the plan is the one segment.
        top = {key: plan.get(key) for key in SEGMENT_KEYS}
        top.update(first_iter=plan.get("start_iter", 0), last_iter=plan["max_iter"] - 1)
        top.update(images_start=plan.get("images_done", 0), images_end=plan.get("images_seen"))
        raw = [top]
    if not isinstance(raw, list) or not raw:
        raise ReportError(f"{path}: 'segments' must be a non-empty list of objects")
    segments = []
    for n, seg in enumerate(raw):
        if not isinstance(seg, dict):
            raise ReportError(f"{path}: segments[{n}] is not an object")
        for key in SEGMENT_NUMBERS:
            if not _whole(seg.get(key)):
                raise ReportError(f"{path}: segments[{n}].{key} missing or not a whole number")
        segments.append({**dict.fromkeys(SEGMENT_KEYS), **seg})
    plan = {k: v for k, v in plan.items() if k != "segments"}
    return plan, segments


def read_events(path: Path, cut_lines_allowed: int = 1) -> tuple[list[dict[str, Any]], list[int]]:
    """detectron2's JSON-lines events in file order, and the numbers of the lines cut short.

    Each attempt appends to the file, so an attempt killed while writing can leave one line cut
    short: up to ``cut_lines_allowed`` such lines are skipped (and returned); more, or a line
    that is JSON but not an event (an object with a whole-number ``iteration``), is
    ReportError naming the file and the line.
    """
    if not path.is_file():
        return [], []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as err:
        raise ReportError(f"{path}: cannot read it ({err.strerror or err})") from None
    events: list[dict[str, Any]] = []
    cut: list[int] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as err:
            cut.append(number)
            if len(cut) > cut_lines_allowed:
                raise ReportError(
                    f"{path}: line {number} is not JSON ({err.msg}); {len(cut)} such lines, "
                    f"more than the {cut_lines_allowed} that killed attempts can leave"
                ) from None
            continue
        if not isinstance(event, dict) or not _whole(event.get("iteration")):
            raise ReportError(
                f"{path}: line {number} is not a detectron2 event "
                "(a JSON object with a whole-number 'iteration')"
            )
        events.append(event)
    return events, cut


# --- curves ------------------------------------------------------------------------------


def _segment_index(segments: list[dict[str, Any]], current: int, iteration: int, back: bool) -> int:
    """The segment an event belongs to: events come in file order, so the segment only moves
    forward; it moves on when the iteration is past the current segment's last one, or when
    the iteration went back (a new attempt) into the next segment's range."""
    while current + 1 < len(segments) and iteration >= segments[current + 1]["first_iter"]:
        last = segments[current]["last_iter"]
        if back or (_whole(last) and iteration > last):
            current += 1
        else:
            break
    return current


def _images_at(segment: dict[str, Any], done: int) -> int:
    return segment["images_start"] + max(0, done - segment["first_iter"]) * segment["global_batch"]


def _place(
    events: list[dict[str, Any]], segments: list[dict[str, Any]], max_iter: int
) -> list[tuple[int, int, int, dict[str, Any]]]:
    """(images seen, iterations done, segment, event) for each event, in file order."""
    placed = []
    current, previous = 0, None
    for event in events:
        iteration = event["iteration"]
        back = previous is not None and iteration < previous
        current = _segment_index(segments, current, iteration, back)
        previous = iteration
        # The last evaluation is logged at max_iter itself, not at the last iteration.
        done = min(iteration + 1, max_iter) if current == len(segments) - 1 else iteration + 1
        placed.append((_images_at(segments[current], done), done, current, event))
    return placed


def _number(value: Any) -> float | None:
    """A finite number or None (JSON has no NaN; detectron2 writes NaN for an empty AP)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _curve(placed: list[tuple[int, int, int, dict[str, Any]]], key: str) -> list[list[Any]]:
    """[images, iteration, value] per event with a finite ``key``. A point at fewer images than
    the last one is a replay after a resume: it replaces the points from there on (work lost
    with the attempt that wrote them)."""
    curve: list[list[Any]] = []
    for images, _, _, event in placed:
        value = _number(event.get(key))
        if value is None:
            continue
        while curve and curve[-1][0] >= images:
            curve.pop()
        curve.append([images, event["iteration"], value])
    return curve


# --- the report --------------------------------------------------------------------------


def _wall_time(attempts: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    if attempts:
        source = f"{LOG_FILE}: timestamps and detectron2's timing lines, attempts summed"
        return {"source": source, **wall_time(attempts)}
    # No log: only detectron2's per-iteration times (median of 20) between logged lines.
    steps, previous = 0.0, -1
    for event in events:
        if (time := _number(event.get("time"))) is not None:
            steps += max(0, event["iteration"] - previous) * time
            previous = event["iteration"]
    return {"source": f"{EVENTS_FILE} (logged iteration times, an estimate)", "steps_s": steps}


def _images_per_second(
    attempts: list[dict[str, Any]], plan: dict[str, Any], images: int, wall: dict[str, Any]
) -> dict[str, float | None]:
    timed_images = timed_s = 0.0
    for a in attempts:
        if a.get("steps_s") and a.get("timed_iters"):
            timed_images += a["timed_iters"] * (a.get("global_batch") or plan["global_batch"])
            timed_s += a["steps_s"]
    total = wall.get("total_s")
    return {
        "steps": timed_images / timed_s if timed_s else None,
        "end_to_end": images / total if total else None,
    }


def build_report(folder: str | Path) -> dict[str, Any]:
    """The report of the run whose output folder is ``folder``; ReportError on bad input."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ReportError(f"{folder}: no such folder")
    plan_path = folder / PLAN_FILE
    if not plan_path.is_file():
        raise ReportError(f"{folder}: not a run's output folder (no {PLAN_FILE}; `megdet train` "
                          "writes it when it starts)")  # fmt: skip
    plan, segments = _read_plan(plan_path)
    try:
        attempts = read_attempts(folder / LOG_FILE)
    except OSError as err:
        raise ReportError(f"{folder / LOG_FILE}: cannot read it ({err.strerror or err})") from None
    events, cut = read_events(folder / EVENTS_FILE, max(1, len(attempts)))
    metrics = None
    if (folder / METRICS_FILE).is_file():
        metrics = _read_json(folder / METRICS_FILE)
        if not isinstance(metrics, dict) or not isinstance(metrics.get("bbox", {}), dict):
            raise ReportError(f"{folder / METRICS_FILE}: expected an object with 'bbox'")

    max_iter = plan["max_iter"]
    placed = _place(events, segments, max_iter)
    trained = [p for p in placed if _number(p[3].get("total_loss")) is not None]
    done = max([p[1] for p in trained], default=plan.get("start_iter", 0))
    segment = segments[trained[-1][2]] if trained else segments[-1]
    evaluated = (metrics or {}).get("iteration")
    if _whole(evaluated):
        done = max(done, min(evaluated, max_iter))
    images = _images_at(segment, done)
    box = (metrics or {}).get("bbox", {})
    curves = {
        "loss": _curve(placed, "total_loss"),
        "lr": _curve(placed, "lr"),
        "ap": _curve(placed, "bbox/AP"),
        "ap50": _curve(placed, "bbox/AP50"),
    }
    if _whole(evaluated) and trained:
        # metrics.json holds the last evaluation; a point after the curve's last one adds it.
        at = _images_at(segment, min(evaluated, max_iter))
        for key, curve in (("AP", curves["ap"]), ("AP50", curves["ap50"])):
            value = _number(box.get(key))
            if value is not None and (not curve or curve[-1][0] < at):
                curve.append([at, evaluated, value])
    wall = _wall_time(attempts, events)
    resumes = sum(1 for a in attempts if a.get("start_iter"))
    for n, attempt in enumerate(attempts, 1):
        if attempt["ended"] is None:
            last_and_done = n == len(attempts) and done >= max_iter
            attempt["ended"] = "finished" if last_and_done else NO_END
    fabrics = [a["fabric"] for a in attempts if a.get("fabric")]
    warnings = [f"{EVENTS_FILE} line {n}: cut short (an attempt killed while writing); skipped"
                for n in cut]  # fmt: skip
    if not events:
        warnings.append(f"{EVENTS_FILE}: no events yet (no curves)")
    return {
        "format": REPORT_FORMAT,
        "folder": str(folder.resolve()),
        "finished": done >= max_iter,
        "iterations": {"done": done, "planned": max_iter},
        "images": {"seen": images, "planned": plan.get("images_seen")},
        "ap": {k: _number(box.get(k)) for k in box} if box else None,
        "evaluated_at": evaluated,
        "dataset": (metrics or {}).get("dataset"),
        "wall_time": wall,
        "images_per_second": _images_per_second(attempts, plan, images, wall),
        "attempt_count": len(attempts) or 1,
        "attempts": attempts,
        "resumes": resumes,
        "fabric": fabrics[-1] if fabrics else NOT_RECORDED,
        "segments": segments,
        "plan": plan,
        "curves": curves,
        "warnings": warnings,
    }


#: The final progress report's run totals (megdet.progress.REPORT_METRICS) and the report's
#: wall-time part each is, in whole seconds.
TOTAL_PARTS = {
    "wallSeconds": "total_s",
    "setupSeconds": "setup_s",
    "stepsSeconds": "steps_s",
    "hooksSeconds": "hooks_s",
    "evaluationSeconds": "evaluation_s",
}


def report_totals(report: dict[str, Any]) -> dict[str, float]:
    """What the trainer's final progress report carries of ``report``: the attempts in the log,
    their wall time by part (whole seconds) and the timed steps' images per second; a part the
    report does not have is left out."""
    wall = report.get("wall_time") or {}
    totals: dict[str, float] = {}
    if report.get("attempts"):
        totals["attempts"] = len(report["attempts"])
    for name, part in TOTAL_PARTS.items():
        if (seconds := _number(wall.get(part))) is not None and seconds >= 0:
            totals[name] = round(seconds)
    rate = _number((report.get("images_per_second") or {}).get("steps"))
    if rate is not None and rate >= 0:
        totals["stepsImagesPerSecond"] = rate
    return totals


def report_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, allow_nan=False) + "\n"


def write_report(folder: str | Path, report: dict[str, Any]) -> list[Path]:
    """Write ``report.json`` and ``report.html`` into ``folder`` (each replaced whole)."""
    from megdet.trainer.report_render import render_page

    written = []
    for name, text in ((REPORT_JSON, report_json(report)), (REPORT_HTML, render_page(report))):
        path = Path(folder) / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        written.append(path)
    return written
