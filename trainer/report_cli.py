"""`megdet report`: a run's report from its output folder (trainer/report.py); no torch."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    """Add `megdet report` to the `megdet` parser."""
    report = subparsers.add_parser(
        "report",
        help="summarize a run from its output folder: AP, images, wall time, attempts, curves",
        description="Read a run's output folder (plan.json, metrics.json, events.jsonl, "
        "log.txt) and print its report: final AP and AP50, iterations and images seen, wall "
        "time by part, images per second, attempts, segments, the plan and the fabric. "
        "Works on a finished, stopped or running run, local or in a cluster. Exit codes: 0 "
        "done, 1 the report could not be written, 2 not a run's output folder or a file in "
        "it is unreadable.",
    )
    report.add_argument("folder", help="the run's output folder (OUTPUT_DIR), e.g. output/demo")
    report.add_argument("--json", action="store_true", help="print report.json's content")
    report.add_argument(
        "--write",
        action="store_true",
        help="also write report.json and report.html (curves, one self-contained page) into "
        "the folder",
    )
    report.set_defaults(handler=run_report)


def run_report(args: argparse.Namespace) -> int:
    import sys

    from megdet.cli import UsageError
    from megdet.trainer.report import ReportError, build_report, report_json, write_report
    from megdet.trainer.report_render import format_report

    try:
        report = build_report(args.folder)
    except ReportError as err:
        raise UsageError(str(err)) from None
    print(
        report_json(report) if args.json else format_report(report), end="" if args.json else "\n"
    )
    if args.write:
        try:
            written = write_report(args.folder, report)
        except OSError as err:
            print(f"megdet report: error: cannot write into {args.folder}: "
                  f"{err.strerror or err}", file=sys.stderr)  # fmt: skip
            return 1
        out = sys.stderr if args.json else sys.stdout
        print("Wrote " + ", ".join(str(p) for p in written), file=out)
    return 0
