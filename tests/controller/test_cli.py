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


# --- megdet render --pods -----------------------------------------------------------------------

PODS_RUN = """\
apiVersion: megdet.io/v1alpha1
kind: MegDetRun
metadata: {name: r50, namespace: vision}
spec: {gpus: 16, restartPolicy: ExitCode}
"""


def pods_of(stdout: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(stdout) if d}


def test_render_pods_prints_a_pytorchjobs_replicas_as_the_operator_makes_them():
    result = megdet("render", "--pods", "-f", "-", stdin=PODS_RUN)
    assert result.returncode == 0, result.stderr
    pods = pods_of(result.stdout)
    assert sorted(pods) == ["r50-master-0", "r50-worker-0"]
    (job,) = [
        o for o in render_run("r50", "vision", {"gpus": 16}).objects if o["kind"] == "PyTorchJob"
    ]
    for name, pod in pods.items():
        rtype = name.split("-")[1]
        template = job["spec"]["pytorchReplicaSpecs"][rtype.title()]["template"]
        assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
        assert pod["metadata"]["namespace"] == "vision"
        assert pod["metadata"]["labels"] == {
            **template["metadata"]["labels"],
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/job-name": "r50",
            "training.kubeflow.org/replica-type": rtype,
            "training.kubeflow.org/replica-index": "0",
            **({"training.kubeflow.org/job-role": "master"} if rtype == "master" else {}),
        }
        # The replica's ExitCode is no pod restartPolicy: the operator writes Never.
        assert pod["spec"] == {**template["spec"], "restartPolicy": "Never"}


def test_render_pods_prints_a_trainjobs_runtime_pod():
    run = PODS_RUN.replace("gpus: 16", "gpus: 16, target: trainjob")
    result = megdet("render", "--pods", "-f", "-", stdin=run)
    assert result.returncode == 0, result.stderr
    (pod,) = pods_of(result.stdout).values()
    assert pod["metadata"]["name"] == "r50-node-0-0"
    labels = pod["metadata"]["labels"]
    assert labels["jobset.sigs.k8s.io/jobset-name"] == "r50"
    assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
    assert labels["batch.kubernetes.io/job-name"] == "r50-node-0"
    assert labels["batch.kubernetes.io/job-completion-index"] == "0"
    assert labels["app.kubernetes.io/component"] == "node"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["containers"][0]["name"] == "node"


def test_render_pods_reads_what_the_run_chart_rendered():
    # `helm template` output, or megdet render's own: the same pods as from the run.
    rendered = megdet("render", "-f", "-", stdin=PODS_RUN).stdout
    from_objects = megdet("render", "--pods", "-f", "-", stdin=rendered)
    from_run = megdet("render", "--pods", "-f", "-", stdin=PODS_RUN)
    assert from_objects.returncode == 0, from_objects.stderr
    assert pods_of(from_objects.stdout) == pods_of(from_run.stdout)


def test_render_pods_refuses_owner_uid_and_foreign_kinds_naming_the_flag():
    result = megdet("render", "--pods", "--owner-uid", "u", "-f", "-", stdin=PODS_RUN)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("megdet render: error: --pods and --owner-uid: ")
    deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"
    result = megdet("render", "--pods", "-f", "-", stdin=deployment)
    assert result.returncode == 2 and result.stdout == ""
    assert "<stdin>#0: not a MegDetRun (apiVersion 'apps/v1', kind 'Deployment'; want " in (
        result.stderr
    )
    assert "kubeflow.org/v1 PyTorchJob" in result.stderr
    # Without --pods the message stays as it was: only MegDetRuns.
    plain = megdet("render", "-f", "-", stdin=deployment)
    assert "want apiVersion megdet.io/v1alpha1)" in plain.stderr


def test_render_pods_refuses_an_invalid_run():
    result = megdet("render", "--pods", "-f", "-", stdin=TWO_RUNS)
    assert result.returncode == 1 and result.stdout == ""
    assert "<stdin>#1 MegDetRun/broken: spec.gpus:" in result.stderr


def test_render_pods_names_a_broken_rendered_job():
    job = "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: j}\nspec: {}\n"
    result = megdet("render", "--pods", "-f", "-", stdin=job)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "megdet render: error: <stdin>: PyTorchJob j: spec.pytorchReplicaSpecs is missing\n"
    )
