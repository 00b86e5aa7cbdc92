"""A run's report (trainer/report.py) as text for a terminal and as ``report.html``.

The page is self-contained: charts are inline SVG drawn here (no script, no network) of the
total loss, learning rate and box AP/AP50 against the images seen, with the segments'
boundaries marked, and the whole report is embedded as JSON
(``<script type="application/json" id="megdet-report">``) for machines.
"""

from __future__ import annotations

import html
import math
import textwrap
from typing import Any

from megdet.trainer.report import METRICS_FILE, report_json

__all__ = ["duration", "format_report", "render_page"]


def duration(seconds: float | None) -> str:
    """``1h 02m 03s``, ``4m 05s``, ``7s`` or ``0.4s``; ``-`` for unknown."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _fmt(value: Any, spec: str = "", none: str = "-") -> str:
    """``value`` formatted, or ``none`` when it is missing."""
    return none if value is None else format(value, spec)


def _ap_text(report: dict[str, Any]) -> str:
    ap = report["ap"]
    if not ap:
        return f"not evaluated (no {METRICS_FILE})"
    values = f"AP {_fmt(ap.get('AP'), '.1f', 'n/a')}  AP50 {_fmt(ap.get('AP50'), '.1f', 'n/a')}"
    return f"{values}  (percent; {METRICS_FILE}, iteration {_fmt(report['evaluated_at'])})"


def _rate_text(rates: dict[str, float | None]) -> str:
    parts = [(rates["steps"], "in training steps"), (rates["end_to_end"], "end to end")]
    return ", ".join(f"{v:.1f} {label}" for v, label in parts if v is not None) or "-"


#: The wall-time parts, in the order they happen, with what each covers.
WALL_PARTS = (
    ("setup_s", "setup", "start to the first iteration: model, data, checkpoint"),
    ("untimed_s", "first iterations", "detectron2 times none of an attempt's first 3"),
    ("steps_s", "steps", "training iterations"),
    ("hooks_s", "hooks", "during the loop: checkpoints, periodic evaluation, writers"),
    ("after_loop_s", "after the loop", "the last evaluation, the report"),
    ("evaluation_s", "of which COCO inference", "in hooks and after the loop"),
)


def format_report(report: dict[str, Any]) -> str:
    """The report as text for a terminal."""
    it, im, wall = report["iterations"], report["images"], report["wall_time"]
    status = "finished" if report["finished"] else f"not finished: {it['done']} of {it['planned']}"
    planned = f" of {im['planned']:,} planned" if isinstance(im["planned"], int) else ""
    lines = [
        f"Run report: {report['folder']} ({status})",
        f"  box AP         {_ap_text(report)}",
        f"  iterations     {it['done']:,} of {it['planned']:,}",
        f"  images seen    {im['seen']:,}{planned}",
        f"  wall time      {duration(wall.get('total_s', wall.get('steps_s')))}"
        f"  ({wall['source']})",
    ]
    for key, name, what in WALL_PARTS:
        if wall.get(key) is not None:
            lines.append(f"    {name:<24} {duration(wall[key]):>10}  {what}")
    lines += [
        f"  images/s       {_rate_text(report['images_per_second'])}",
        f"  attempts       {report['attempt_count']} ({report['resumes']} resumed)",
    ]
    for n, a in enumerate(report["attempts"], 1):
        lines.append(
            f"    {n}. {a['started']}  from iteration {_fmt(a['start_iter'])}, world size "
            f"{_fmt(a['world_size'])}, {duration(a['wall_s'])}, ended: {a['ended']}"
        )
    lines += [
        f"  fabric         {report['fabric']}",
        "  segments       iterations, world size, global batch, accumulation, lr, images",
    ]
    for s in report["segments"]:
        lines.append(
            f"    {s['first_iter']}-{_fmt(s['last_iter'], '', '?')}  x{_fmt(s['world_size'])}"
            f"  batch {s['global_batch']}  accum {_fmt(s['accumulation_steps'])}"
            f"  lr {_fmt(s['lr'], 'g')}  images {s['images_start']:,}-{_fmt(s['images_end'], ',')}"
            + (f"  {s['resize']}" if s.get("resize") else "")
        )
    plan = ", ".join(f"{k} {v}" for k, v in report["plan"].items())
    lines.append("  plan           " + textwrap.fill(plan, 84, subsequent_indent=" " * 17))
    lines += [f"  warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)


# --- the page ----------------------------------------------------------------------------

WIDTH, HEIGHT = 720, 240
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 16, 40
COLORS = ("#1f77b4", "#ff7f0e")
#: Series with at most this many points get a marker (with a tooltip) per point.
MAX_MARKED = 60
_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 760px; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; } td, th { padding: 2px 10px 2px 0; text-align: left; }
th { font-weight: 600; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
svg text { font: 11px system-ui, sans-serif; fill: #444; }
.muted { color: #777; } .warn { color: #a40; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _ticks(high: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to ``high``."""
    if high <= 0:
        return [0.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(high / step + 1e-9) + 1)]


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:.3g}"


def _chart(
    title: str,
    series: list[tuple[str, list[list[float]]]],
    x_high: float,
    boundaries: list[tuple[float, str]],
) -> str:
    """One SVG line chart: ``series`` of (name, [[images, iteration, value], ...])."""
    values = [p[2] for _, points in series for p in points]
    if not values:
        return f'<h2>{_e(title)}</h2><p class="muted">no data in events.jsonl</p>'
    y_high = max(values) * 1.05 or 1.0
    x_high = x_high or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(v: float) -> str:
        return f"{LEFT + plot_w * v / x_high:.1f}"

    def y(v: float) -> str:
        return f"{TOP + plot_h * (1 - v / y_high):.1f}"

    bottom = TOP + plot_h
    parts = [f'<svg width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{_e(title)}">']
    for t in _ticks(y_high):
        parts.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(t)}" y2="{y(t)}" stroke="#eee"/>'
        )
        parts.append(f'<text x="{LEFT - 6}" y="{y(t)}" dy="4" text-anchor="end">{_label(t)}</text>')
    for t in _ticks(x_high, 6):
        parts.append(f'<text x="{x(t)}" y="{bottom + 16}" text-anchor="middle">{_label(t)}</text>')
    middle = LEFT + plot_w / 2
    parts.append(f'<text x="{middle}" y="{HEIGHT - 6}" text-anchor="middle">images seen</text>')
    for at, name in boundaries:
        parts.append(f'<line x1="{x(at)}" x2="{x(at)}" y1="{TOP}" y2="{bottom}" stroke="#999" '
                     f'stroke-dasharray="4 3"/><text x="{x(at)}" dx="3" y="{TOP + 10}">{_e(name)}'
                     "</text>")  # fmt: skip
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
                 'stroke="#ccc"/>')  # fmt: skip
    legend = []
    for (name, points), color in zip(series, COLORS, strict=False):
        coords = " ".join(f"{x(p[0])},{y(p[2])}" for p in points)
        parts.append(f'<polyline data-name="{_e(name)}" points="{coords}" fill="none" '
                     f'stroke="{color}" stroke-width="1.5"/>')  # fmt: skip
        if len(points) <= MAX_MARKED:
            for images, iteration, value in points:
                parts.append(f'<circle cx="{x(images)}" cy="{y(value)}" r="2.5" fill="{color}">'
                             f"<title>{_e(name)} {value:.4g} at iteration {iteration}, "
                             f"{images:,} images</title></circle>")  # fmt: skip
        legend.append(f'<span style="color:{color}">&#9632; {_e(name)}</span>')
    parts.append("</svg>")
    return f"<h2>{_e(title)}</h2><div>{' '.join(legend)}</div>" + "".join(parts)


def _rows(rows: list[tuple[Any, ...]], header: tuple[str, ...] = ()) -> str:
    head = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table>{head}{body}</table>"


def _summary(report: dict[str, Any]) -> str:
    it, im = report["iterations"], report["images"]
    planned = f" of {im['planned']:,}" if isinstance(im["planned"], int) else ""
    return _rows(
        [
            ("box AP", _ap_text(report)),
            ("iterations", f"{it['done']:,} of {it['planned']:,}"),
            ("images seen", f"{im['seen']:,}{planned}"),
            ("wall time", duration(report["wall_time"].get("total_s"))),
            ("images per second", _rate_text(report["images_per_second"])),
            ("attempts", f"{report['attempt_count']} ({report['resumes']} resumed)"),
            ("fabric", report["fabric"]),
        ]
    )


ATTEMPT_COLUMNS = (
    ("started", "started"), ("start_iter", "from iteration"), ("world_size", "world size"),
    ("global_batch", "global batch"), ("wall_s", "wall time"), ("ended", "ended"),
    ("fabric", "fabric"),
)  # fmt: skip


def render_page(report: dict[str, Any]) -> str:
    """The report as a complete HTML page."""
    curves, segments, wall = report["curves"], report["segments"], report["wall_time"]
    x_high = max(
        [report["images"]["planned"] or 0, report["images"]["seen"]]
        + [p[0] for curve in curves.values() for p in curve]
    )
    boundaries = [
        (s["images_start"], f"{_fmt(s['world_size'], '', '?')} GPUs") for s in segments[1:]
    ]
    wall_rows = [
        (name, duration(wall[key]), what)
        for key, name, what in WALL_PARTS
        if wall.get(key) is not None
    ]
    attempts = [
        tuple(duration(a[k]) if k == "wall_s" else a[k] for k, _ in ATTEMPT_COLUMNS)
        for a in report["attempts"]
    ]
    keys = tuple(segments[0])
    status = "finished" if report["finished"] else "not finished"
    ap_series = [("AP", curves["ap"]), ("AP50", curves["ap50"])]
    body = [
        f"<h1>MegDet run report ({status})</h1>",
        f'<p class="muted">{_e(report["folder"])}</p>',
        _summary(report),
        *(f'<p class="warn">{_e(w)}</p>' for w in report["warnings"]),
        _chart("Total loss", [("total loss", curves["loss"])], x_high, boundaries),
        _chart("Learning rate", [("lr", curves["lr"])], x_high, boundaries),
        _chart("Box AP (percent)", ap_series, x_high, boundaries),
        f'<h2>Wall time by part</h2><p class="muted">{_e(wall["source"])}</p>',
        _rows(wall_rows),
        "<h2>Attempts</h2>",
        _rows(attempts, tuple(title for _, title in ATTEMPT_COLUMNS)),
        "<h2>Segments</h2>",
        _rows([tuple(s.get(k) for k in keys) for s in segments], keys),
        "<h2>Plan</h2>",
        _rows(list(report["plan"].items())),
        # "</" cannot end the script early: JSON allows "<\/" for "</".
        '<script type="application/json" id="megdet-report">'
        + report_json(report).replace("</", "<\\/")
        + "</script>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>MegDet run report: {_e(report['folder'])}</title><style>{_STYLE}</style>"
        "</head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
