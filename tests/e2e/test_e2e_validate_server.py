"""`megdet validate --kubeconfig` against the real API server: a server-side dry run (nothing
stored) whose verdict is the server's own (schema, CEL, the admission policy), printed one line
per field, and the same verdict as the offline mode for runs the policy does not touch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from e2e_helpers import ROOT, mdr, namespace

NS = "validate-server-e2e"
BASE = {"gpus": 8, "dataset": {"claimName": "coco"}, "output": {"claimName": "out"}}


@pytest.fixture(scope="module")
def ns(kube, operator_chart):
    return namespace(kube, NS)


def validate(tmp_path: Path, runs: list[dict], *flags: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump_all(runs))
    result = subprocess.run(
        [sys.executable, "-m", "megdet", "validate", "-f", str(path), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    result.stdout = result.stdout.replace(f"{tmp_path}/", "")  # labels: runs.yaml#<n> ...
    return result


def stored_runs(kube) -> str:
    """The runs in this test's namespace (other e2e modules keep runs in theirs)."""
    return kube.kubectl("get", "mdr", "-n", NS, "-o", "name").stdout.strip()


def test_a_valid_run_passes_and_nothing_is_stored(kube, ns, tmp_path) -> None:
    result = validate(tmp_path, [mdr("ok", ns, BASE)], "--kubeconfig", str(kube.kubeconfig))
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "runs.yaml#0 MegDetRun/ok: valid (API server dry-run" in result.stdout
    assert "server dry-run at https://" in result.stderr
    assert stored_runs(kube) == ""


def test_the_namespace_flag_and_a_missing_namespace(kube, ns, tmp_path) -> None:
    run = {**mdr("ok", ns, BASE), "metadata": {"name": "ok"}}
    flags = ("--kubeconfig", str(kube.kubeconfig))
    assert validate(tmp_path, [run], *flags, "--namespace", ns).returncode == 0
    result = validate(tmp_path, [run], *flags, "--namespace", "no-such-ns")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "--namespace" in result.stderr and "Traceback" not in result.stderr


def test_a_cel_refusal_is_the_servers_message(kube, ns, tmp_path) -> None:
    run = mdr("twelve", ns, {**BASE, "gpus": 12, "gpusPerNode": 8})
    result = validate(tmp_path, [run], "--kubeconfig", str(kube.kubeconfig))
    assert result.returncode == 1, (result.stdout, result.stderr)
    (line,) = result.stdout.splitlines()
    assert line.startswith("runs.yaml#0 MegDetRun/twelve: spec.gpus: Invalid value")
    assert "gpus above gpusPerNode must be a multiple of gpusPerNode" in line
    assert stored_runs(kube) == ""


def test_a_policy_refusal_names_the_field_and_the_policy_value(kube, ns, tmp_path) -> None:
    run = mdr("elsewhere", ns, {**BASE, "image": {"repository": "docker.io/x/y"}})
    result = validate(tmp_path, [run], "--kubeconfig", str(kube.kubeconfig))
    assert result.returncode == 1, (result.stdout, result.stderr)
    (line,) = result.stdout.splitlines()
    assert line.startswith("runs.yaml#0 MegDetRun/elsewhere: spec.image.repository: ")
    assert "policy.imageRepositories" in line
    # Offline mode knows nothing of the cluster's policy: that is what asking the server adds.
    assert validate(tmp_path, [run]).returncode == 0


# Runs outside the policy's fields: the offline verdict must be the server's (and the
# controller's checks after it). (spec change, name)
SAMPLE = [
    ({}, "plain"),
    ({"gpus": 16}, "two-nodes"),
    ({"gpus": 12}, "twelve"),
    ({"gpus": 4, "gpusPerNode": 4}, "four"),
    ({"gpus": 0}, "zero"),
    ({"steps": [30000, 20000]}, "steps-down"),
    ({"steps": [500, 60000], "maxIter": 90000}, "steps-up"),
    ({"warmupIters": 90000}, "long-warmup"),
    ({"syncBN": "partial"}, "sync-partial"),
    ({"syncBN": "none", "schedule": "cosine"}, "cosine"),
    ({"scaling": "sqrt", "baseLr": 0.02}, "sqrt"),
    ({"baseLr": -1.0}, "negative-lr"),
    ({"extraOverrides": {"SOLVER.BASE_LR": 1}}, "owned-override"),
    ({"extraOverrides": {"TEST.EVAL_PERIOD": 5}}, "free-override"),
    ({"extraOverrides": {"lower.case": 1}}, "bad-override-key"),
    ({"nccl": {"ib": {"enabled": True, "rdmaResourceName": ""}}}, "ib-no-resource"),
    ({"nccl": {"ib": {"enabled": True, "rdmaResourceName": "rdma/rdma_shared_device_a"}}}, "ib"),
    ({"kueue": {"queueName": "q"}, "runPolicy": {"suspend": True}}, "kueue-suspend"),
    ({"target": "trainjob", "gpus": 16}, "trainjob"),
    ({"resources": {"qos": "Burstable", "cpu": "500m"}}, "burstable"),
    ({}, "1run"),
    ({}, "x" * 51),
    ({"bogus": 1}, "unknown-field"),
]


def verdicts(result: subprocess.CompletedProcess[str], count: int) -> list[bool]:
    """Per document (by index): valid?"""
    lines = result.stdout.splitlines()
    found = []
    for index in range(count):
        mine = [line for line in lines if line.startswith(f"runs.yaml#{index} ")]
        assert mine, (index, result.stdout, result.stderr)
        found.append(all(": valid" in line for line in mine))
    return found


def test_offline_and_server_verdicts_agree(kube, ns, tmp_path) -> None:
    runs = [mdr(name, ns, {**BASE, **change}) for change, name in SAMPLE]
    offline = validate(tmp_path, runs)
    server = validate(tmp_path, runs, "--kubeconfig", str(kube.kubeconfig))
    assert offline.returncode == server.returncode == 1, (offline.stderr, server.stderr)
    assert verdicts(offline, len(runs)) == verdicts(server, len(runs)), (
        offline.stdout,
        server.stdout,
    )
    accepted = verdicts(server, len(runs)).count(True)
    assert 6 <= accepted <= len(runs) - 6, server.stdout  # both verdicts well represented
    assert stored_runs(kube) == ""
