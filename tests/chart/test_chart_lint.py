"""kube-score and kubeconform over both charts' default and CI renders and over the pods their
jobs create (`megdet render --pods`): kubeconform finds every object valid, and every kube-score
finding is one that docs/helm.md ("Accepted findings") justifies, row by row; a row that no
longer matches anything fails too. One run of each tool over every file (tests/chart/kube_lint.py
says where the tools and the schemas come from)."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from chart_helpers import CHART_DIR, values_file
from kube_lint import (
    Finding,
    Justification,
    justifications,
    kube_score,
    kubeconform,
    unjustified,
    write_schemas,
)

from megdet.controller.render import split_manifests

OPERATOR_DIR = CHART_DIR.parent / "megdet-operator"
#: What the controller gives a run with networkPolicy on (its progress endpoint, its CA).
CONTROLLER_RUN = {
    "progress": {
        "url": "https://megdet-operator-progress.megdet-system.svc:8443",
        "caConfigMap": "megdet-progress-ca",
        "runUID": "0d2f-uid",
    },
    "networkPolicy": {"enabled": True, "restrictEgress": True},
}


def renders() -> list[tuple[str, Path, dict[str, Any]]]:
    """(name, chart, values): each render gets its own namespace, its name, so that
    kube-score's checks across objects (a NetworkPolicy or Service for a pod) stay within it."""
    out = [
        ("run-default", CHART_DIR, {}),
        ("run-trainjob", CHART_DIR, {"target": "trainjob"}),
        ("run-controller", CHART_DIR, CONTROLLER_RUN),
        ("op-default", OPERATOR_DIR, {}),
    ]
    for prefix, chart in (("run", CHART_DIR), ("op", OPERATOR_DIR)):
        for path in sorted((chart / "ci").glob("*-values.yaml")):
            out.append(
                (f"{prefix}-{path.name.removesuffix('-values.yaml')}", chart, values_file(path))
            )
    return out


@dataclass
class Linted:
    charts: list[Path]  # one file per render
    pods: Path
    crds: list[Path]
    schemas: Path
    pod_docs: list[dict[str, Any]]

    @property
    def files(self) -> list[Path]:
        return [*self.charts, self.pods]


@pytest.fixture(scope="module")
def linted(tmp_path_factory) -> Linted:
    folder = tmp_path_factory.mktemp("lint")
    charts = []
    for name, chart, values in renders():
        with helm_python.Chart.load(str(chart)) as loaded:
            release = "megdet-operator" if chart == OPERATOR_DIR else "megdet"
            files = loaded.render(values=copy.deepcopy(values), name=release, namespace=name)
        objects, _ = split_manifests(files)
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
        charts.append(path)
    run_files = [p for p in charts if p.name.startswith("run-")]
    args = [a for p in run_files for a in ("-f", str(p))]
    pods = subprocess.run(
        [sys.executable, "-m", "megdet", "render", "--pods", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (folder / "pods.yaml").write_text(pods)
    crds = sorted(OPERATOR_DIR.glob("crds/*.yaml"))
    kinds = {
        (d["apiVersion"], d["kind"])
        for path in [*charts, folder / "pods.yaml", *crds]
        for d in yaml.safe_load_all(path.read_text())
        if d
    }
    return Linted(
        charts=charts,
        pods=folder / "pods.yaml",
        crds=crds,
        schemas=write_schemas(folder / "schemas", kinds),
        pod_docs=[d for d in yaml.safe_load_all(pods) if d],
    )


@pytest.fixture(scope="module")
def findings(linted) -> list[Finding]:
    return kube_score(linted.files)


def test_every_render_gives_its_jobs_pods(linted):
    by_render = Counter(p["metadata"]["namespace"] for p in linted.pod_docs)
    assert all(p["apiVersion"] == "v1" and p["kind"] == "Pod" for p in linted.pod_docs)
    # A Master and a Worker for multi-node PyTorchJobs, a Master alone for one node, one pod
    # template for a TrainingRuntime's replicated job.
    assert by_render == {
        "run-default": 1,
        "run-trainjob": 1,
        "run-controller": 1,
        "run-hostnetwork": 2,
        "run-multinode-ib": 2,
        "run-single-gpu": 1,
        "run-small-nodes": 2,
        "run-trainjob-multinode": 1,
    }


def test_kubeconform_finds_every_object_valid(linted):
    resources = kubeconform([*linted.files, *linted.crds], linted.schemas)
    documents = sum(
        1 for p in [*linted.files, *linted.crds] for d in yaml.safe_load_all(p.read_text()) if d
    )
    assert len(resources) == documents
    bad = [r for r in resources if r["status"] != "statusValid"]
    assert bad == []
    kinds = {r["kind"] for r in resources}
    # Custom resources too: their schemas come from their CRDs.
    assert {"Pod", "PyTorchJob", "TrainJob", "TrainingRuntime", "NetworkPolicy"} <= kinds
    assert {"PodDisruptionBudget", "ServiceMonitor", "ClusterKopfPeering"} <= kinds
    assert "CustomResourceDefinition" in kinds


def test_kubeconform_refuses_a_misspelt_field_in_a_pod_and_a_job(linted, tmp_path):
    pod = copy.deepcopy(linted.pod_docs[0])
    pod["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    job = next(
        d for d in yaml.safe_load_all(linted.charts[0].read_text()) if d["kind"] == "PyTorchJob"
    )
    job["spec"]["runPolicy"]["backofLimit"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all([pod, job]))
    resources = {r["kind"]: r for r in kubeconform([bad], linted.schemas)}
    assert {k: r["status"] for k, r in resources.items()} == {
        "Pod": "statusInvalid",
        "PyTorchJob": "statusInvalid",
    }
    assert "'imagePulPolicy' not allowed" in resources["Pod"]["msg"]
    assert "'backofLimit' not allowed" in resources["PyTorchJob"]["msg"]


def test_every_kube_score_finding_is_justified_in_the_docs(findings):
    left, stale = unjustified(findings, justifications())
    assert not left, "findings docs/helm.md does not justify:\n" + "\n".join(map(str, left))
    assert not stale, "rows that match no finding:\n" + "\n".join(
        f"{r.check} {', '.join(r.objects)} in {', '.join(r.renders)}" for r in stale
    )


def test_kube_score_looks_at_the_pods_and_an_unjustified_finding_fails(linted, tmp_path):
    scored = kube_score([linted.pods])
    assert {f.kind for f in scored} == {"Pod"}
    # A privileged trainer container is nothing the docs accept.
    pod = copy.deepcopy(linted.pod_docs[0])
    pod["spec"]["containers"][0]["securityContext"]["privileged"] = True
    bad = tmp_path / "privileged.yaml"
    bad.write_text(yaml.safe_dump(pod))
    left, _ = unjustified(kube_score([bad]), justifications())
    assert [f.check for f in left] == ["container-security-context-privileged"]


def test_the_controller_has_a_budget_and_a_policy_option(findings):
    # Two or more replicas get a PodDisruptionBudget; the CI render with the controller's
    # NetworkPolicy on leaves kube-score nothing to say about the controller's pods and network.
    assert not [f for f in findings if f.check == "deployment-has-poddisruptionbudget"]
    networked = [
        f for f in findings if f.render == "op-servicemonitor" and f.check == "pod-networkpolicy"
    ]
    assert networked == []
    # The run the controller creates with networkPolicy on: its pods are covered too.
    assert not [
        f for f in findings if f.render == "run-controller" and f.check == "pod-networkpolicy"
    ]


def test_justification_rows_match_by_check_object_and_render():
    text = """
### Accepted findings

| Check | Objects | Renders | Why |
|---|---|---|---|
| `pod-networkpolicy` | `Pod/*-master-0`, `Deployment/megdet-operator` | `run-*` | off by default |
"""
    (row,) = justifications(text)
    assert row == Justification(
        "pod-networkpolicy",
        ("Pod/*-master-0", "Deployment/megdet-operator"),
        ("run-*",),
        "off by default",
    )
    hit = Finding("pod-networkpolicy", "Pod", "megdet-master-0", "run-default", "")
    assert row.covers(hit)
    assert not row.covers(Finding("pod-networkpolicy", "Pod", "megdet-master-0", "op-x", ""))
    assert not row.covers(Finding("pod-probes", "Pod", "megdet-master-0", "run-default", ""))
    assert unjustified([hit], [row]) == ([], [])
