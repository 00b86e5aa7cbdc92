"""Where the tests find the repository's files: its root, the two charts, the run chart's values
schema, and its tracked text files of some kinds (for the tests that read every one of them:
tests/megdet/test_no_issue_numbers.py, tests/operator_chart/test_generated_headers.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The run chart (one training run) and the operator chart (the controller and its policy).
RUN_CHART = ROOT / "charts" / "megdet"
OPERATOR_CHART = ROOT / "charts" / "megdet-operator"


def run_values_schema() -> dict[str, Any]:
    """The run chart's values.schema.json: its ``properties`` (the schema of each value)."""
    return json.loads((RUN_CHART / "values.schema.json").read_text())["properties"]


def tracked_files(suffixes: tuple[str, ...], names: tuple[str, ...] = ()) -> list[Path]:
    """The files git tracks (as they are in the working tree) whose name ends with one of
    ``suffixes`` or is one of ``names``."""
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    paths = [ROOT / name for name in listed]
    return [p for p in paths if (p.name.endswith(suffixes) or p.name in names) and p.is_file()]
