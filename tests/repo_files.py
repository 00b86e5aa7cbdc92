"""The repository's tracked text files of some kinds, for the tests that read every one of them
(tests/megdet/test_no_issue_numbers.py, tests/operator_chart/test_generated_headers.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tracked_files(suffixes: tuple[str, ...], names: tuple[str, ...] = ()) -> list[Path]:
    """The files git tracks (as they are in the working tree) whose name ends with one of
    ``suffixes`` or is one of ``names``."""
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    paths = [ROOT / name for name in listed]
    return [p for p in paths if (p.name.endswith(suffixes) or p.name in names) and p.is_file()]
