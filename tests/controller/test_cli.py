"""`megdet validate` and `megdet render` as users and CI run them: real subprocesses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from megdet.controller.render import render_run

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

TWO_RUNS = """\
apiVersion: megdet.io/v1alpha1
kind: MegDetRun
metadata: {name: fine}
spec: {gpus: 16}
---
apiVersion: megdet.io/v1alpha1
kind: MegDetRun
metadata: {name: broken}
spec:
  gpus: 12
  nccl: {ib: {enabled: true}}
"""


def megdet(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "megdet", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_validate_examples_exit_0():
    args = [a for path in EXAMPLES for a in ("-f", str(path.relative_to(REPO)))]
    result = megdet("validate", *args)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(EXAMPLES)
    assert all(line.endswith(": valid") for line in lines)
    assert lines[0].startswith("examples/megdetrun-16gpu-ib.yaml#0 MegDetRun/r50-fpn-16gpu-ib")


def test_validate_prints_one_line_per_problem_naming_document_and_field():
    result = megdet("validate", "-q", "-f", "-", stdin=TWO_RUNS)
    assert result.returncode == 1
    assert result.stderr == ""
    # The schema and CEL layer reports every rule the spec breaks, each on its field.
    assert result.stdout.splitlines() == [
        "<stdin>#1 MegDetRun/broken: spec.gpus: gpus above gpusPerNode must be a multiple of "
        "gpusPerNode (multi-node runs use whole nodes)",
        "<stdin>#1 MegDetRun/broken: spec.nccl.ib.rdmaResourceName: nccl.ib.enabled needs "
        "nccl.ib.rdmaResourceName: the extended resource your RDMA device plugin advertises "
        "(e.g. rdma/rdma_shared_device_a, rdma/hca_shared_devices_a, nvidia.com/hostdev)",
    ]


def test_validate_checks_the_object_around_the_spec(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text(
        "apiVersion: megdet.io/v1alpha1\nkind: MegDetRun\nmetadata: {}\nspex: {gpus: 8}\n"
    )
    result = megdet("validate", "-f", str(run))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{run}#0 MegDetRun/<no name>: spex: unknown field",
        f"{run}#0 MegDetRun/<no name>: metadata.name: is required",
        f"{run}#0 MegDetRun/<no name>: spec: is required",
    ]


def test_validate_bad_input_exits_2_without_a_traceback(tmp_path):
    not_yaml = tmp_path / "broken.yaml"
    not_yaml.write_text("spec: [unclosed\n")
    other_kind = tmp_path / "cm.yaml"
    other_kind.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    result = megdet(
        "validate", "-f", str(tmp_path / "missing.yaml"), "-f", str(not_yaml), "-f",
        str(other_kind), "-f", str(EXAMPLES[0]),
    )  # fmt: skip
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"megdet validate: error: {tmp_path / 'missing.yaml'}: cannot read: "
        "No such file or directory",
        f"megdet validate: error: {not_yaml}: not YAML (line 2): "
        "expected ',' or ']', but got '<stream end>'",
        f"megdet validate: error: {other_kind}#0: not a MegDetRun (apiVersion 'v1', kind "
        "'ConfigMap'; want apiVersion megdet.io/v1alpha1)",
    ]
    # The readable run is still checked.
    assert result.stdout.strip().endswith(": valid")


def test_a_file_without_documents_is_bad_input_not_valid(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("---\n# nothing here\n---\n")
    for command in ("validate", "render"):
        result = megdet(command, "-f", str(empty))
        assert result.returncode == 2, result
        assert result.stderr == (
            f"megdet {command}: error: {empty}: no MegDetRun in it (the file has no YAML "
            "documents)\n"
        )
        assert result.stdout == ""


def test_render_prints_what_the_controller_creates():
    path = REPO / "examples" / "megdetrun-16gpu-ib.yaml"
    result = megdet("render", "-f", str(path))
    assert result.returncode == 0, result.stderr
    printed = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    run = yaml.safe_load(path.read_text())
    expected = render_run(run["metadata"]["name"], "default", run["spec"]).objects
    assert printed == list(expected)
    assert printed[0]["kind"] == "PyTorchJob"
    assert "ownerReferences" not in printed[0]["metadata"]


def test_render_with_owner_uid_adds_the_controllers_owner_reference():
    path = REPO / "examples" / "megdetrun-8gpu.yaml"
    result = megdet("render", "-f", str(path), "--owner-uid", "0b7c-uid")
    assert result.returncode == 0, result.stderr
    job = next(doc for doc in yaml.safe_load_all(result.stdout) if doc)
    (ref,) = job["metadata"]["ownerReferences"]
    assert ref["uid"] == "0b7c-uid" and ref["controller"] is True
    assert (ref["kind"], ref["name"]) == ("MegDetRun", "r50-fpn-8gpu")


def test_render_refuses_an_invalid_run_and_prints_nothing():
    result = megdet("render", "-f", "-", stdin=TWO_RUNS)
    assert result.returncode == 1
    assert result.stdout == ""
    assert "<stdin>#1 MegDetRun/broken: spec.gpus:" in result.stderr


def test_help_lists_the_commands():
    result = megdet("--help")
    assert "validate" in result.stdout and "render" in result.stdout
