"""`make test`'s pytest-xdist workers: every test of an e2e module that uses the cluster goes
to the one worker that holds the session's cluster (conftest.py's xdist group), its tests that
use no cluster included (test_apply_runs.py's last test checks what the ones before it
recorded); the other tests go to any worker, this module among them (it starts no cluster: it
is not on that worker's long chain). Checked on a plan of three modules (``--setup-plan``
starts no fixture, so no cluster)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import CLUSTER_GROUP
from e2e_helpers import ROOT


def test_e2e_modules_that_use_the_cluster_are_one_xdist_group_and_the_others_are_not() -> None:
    e2e, other = "tests/e2e/test_apply_runs.py", "tests/megdet/test_fabric_report.py"
    no_cluster = str(Path(__file__).resolve().relative_to(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "--setup-plan",
         "-v", "-p", "no:cacheprovider", e2e, other, no_cluster],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode in (0, 5), proc.stdout[-3000:] + proc.stderr[-3000:]  # none ran
    # One node id a line (parameter ids may hold spaces).
    ids = [line.rstrip() for line in proc.stdout.splitlines() if line.startswith("tests/")]
    for module in (e2e, other, no_cluster):
        assert [i for i in ids if i.startswith(module)], (module, proc.stdout[-3000:])
    assert f"{e2e}::test_the_agreement_covered_both_verdicts@{CLUSTER_GROUP}" in ids, ids
    for nodeid in ids:
        grouped = nodeid.endswith(f"@{CLUSTER_GROUP}")
        assert grouped == nodeid.startswith(e2e), nodeid
