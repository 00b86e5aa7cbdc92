"""`helm install megdet-operator charts/megdet-operator` on a real API server: the CRD is
accepted and served, `kubectl explain` reads its schema, and the controller, logged in as the
chart's ServiceAccount, does its work with no call refused and no call outside its role."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pytest
import yaml
from e2e_helpers import CONTROLLER_USER, OPERATOR_NAMESPACE, ROOT, eventually, get_json, helm

from cluster import build
from cluster.control_plane import Cluster
from megdet.api.crd import CRD_FILE, build_crd
from megdet.controller.api import PLURAL


def test_crd_is_established_and_matches_the_generated_one(kube, operator_chart) -> None:
    crd = get_json(kube, "crd", f"{PLURAL}.megdet.io")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True", crd["status"]
    assert conditions.get("NamesAccepted") == "True", crd["status"]
    served = crd["spec"]["versions"][0]
    expected = build_crd()["spec"]["versions"][0]
    # The server kept every printer column and rule the generator wrote.
    assert [(c["name"], c["jsonPath"]) for c in served["additionalPrinterColumns"]] == [
        (c["name"], c["jsonPath"]) for c in expected["additionalPrinterColumns"]
    ]
    spec_rules = served["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"
    ]
    assert [r["rule"] for r in spec_rules] == [
        r["rule"]
        for r in expected["schema"]["openAPIV3Schema"]["properties"]["spec"][
            "x-kubernetes-validations"
        ]
    ]


def test_kubectl_explain_reads_the_schema(kube, operator_chart) -> None:
    out = eventually(
        lambda: (p := kube.kubectl("explain", "mdr.spec", check=False)).returncode == 0
        and p.stdout,
        timeout=30,
        message="kubectl explain mdr.spec",
    )
    assert "gpus" in out and "syncBN" in out
    gpus = kube.kubectl("explain", "mdr.spec.gpus").stdout
    assert "GPUs" in gpus or "gpus" in gpus.lower()
    assert "megdet.io" in kube.kubectl("api-resources", "--api-group=megdet.io").stdout


def test_kubectl_and_helm_cache_discovery_with_the_cluster_not_in_home(kube, operator_chart):
    # Their default, ~/.kube/cache, kept one folder per API server address: every test
    # cluster on a new port left one there for good.
    kube.kubectl("api-resources", "--api-group=megdet.io")
    helm(kube, "list", "-n", OPERATOR_NAMESPACE)
    server = urllib.parse.urlsplit(kube.server).netloc.replace(":", "_")
    ours = kube.root / "kube-cache" / "discovery"
    assert server in [p.name for p in ours.iterdir()], sorted(ours.iterdir())
    assert not (Path.home() / ".kube" / "cache" / "discovery" / server).exists()


def test_helm_lists_the_release_deployed(kube, operator_chart) -> None:
    releases = json.loads(helm(kube, "list", "-n", OPERATOR_NAMESPACE, "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in releases] == [(operator_chart, "deployed")]


def test_controller_runs_with_its_role_and_no_more(kube, controller) -> None:
    """Every call the controller made was allowed by the chart's RBAC; a call outside its role
    is refused by the server."""
    # Something must have happened first: the controller listed and watched its runs.
    eventually(
        lambda: [e for e in kube.audit_events(CONTROLLER_USER) if e["verb"] == "watch"],
        timeout=60,
        message="a watch by the controller in the audit log",
    )
    # A 403 for a namespace being deleted is not the role's (an earlier module's namespace
    # may still be terminating): the controller stops writing there after one such answer
    # (tests/controller/test_progress_ca_namespace.py).
    denied = [
        (e["verb"], e.get("objectRef"), e["responseStatus"].get("code"))
        for e in kube.audit_events(CONTROLLER_USER)
        if e.get("stage") == "ResponseComplete"
        and e["responseStatus"].get("code") == 403
        and not any(
            c.get("reason") == "NamespaceTerminating"
            for c in (e["responseStatus"].get("details") or {}).get("causes") or []
        )
    ]
    assert denied == []
    config = controller.workdir / "controller.kubeconfig"
    for args in (
        ("get", "secrets", "-n", OPERATOR_NAMESPACE),
        ("create", "namespace", "stolen"),
        ("get", "nodes"),
    ):
        proc = kube.kubectl(*args, check=False, kubeconfig=config)
        assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), (args, proc.stderr)


@pytest.mark.previous_apiserver
def test_the_crd_installs_on_an_older_api_server(tmp_path) -> None:
    """The same CRD on kube-apiserver 1.34 (the oldest minor the Go module proxy serves; the
    documented floor, 1.28, is checked with kubernetes-validate in tests/operator_chart)."""
    older = Cluster(
        root=tmp_path / "older",
        ports_mode="auto",
        api_only=True,
        apiserver="kube-apiserver-previous",
    )
    try:
        older.up(timeout=120)
        assert build.pins()["kubernetes_previous"] in older.kubectl("version").stdout
        older.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
        older.wait_established(f"{PLURAL}.megdet.io")
        older.kubectl("create", "namespace", "v")
        applied = older.kubectl(
            "apply", "-n", "v", "-f", str(ROOT / "examples/megdetrun-8gpu.yaml")
        )
        assert "created" in applied.stdout
        refused = older.kubectl(
            "apply",
            "-n",
            "v",
            "-f",
            "-",
            check=False,
            input="apiVersion: megdet.io/v1alpha1\nkind: MegDetRun\n"
            "metadata: {name: r}\nspec: {gpus: 12}\n",
        )
        assert "gpus above gpusPerNode must be a multiple" in refused.stderr
    finally:
        older.down()


def rendered_object(kube, release: str, kind: str, *sets: str) -> dict:
    """The one ``kind`` object of `helm template` of the operator chart with ``--set``s, for
    the API server's version (the chart's kubeVersion)."""
    version = json.loads(kube.kubectl("version", "-o", "json").stdout)["serverVersion"]
    rendered = helm(
        kube, "template", release, "charts/megdet-operator", "-n", OPERATOR_NAMESPACE,
        "--kube-version", version["gitVersion"].lstrip("v"), *(f"--set={s}" for s in sets),
    ).stdout  # fmt: skip
    (obj,) = [d for d in yaml.safe_load_all(rendered) if d and d.get("kind") == kind]
    return obj


def stored_by_dry_run(kube, obj: dict) -> dict:
    """``obj`` as the API server would store it (a server-side dry-run create)."""
    return json.loads(
        kube.kubectl(
            "create", "--dry-run=server", "-n", OPERATOR_NAMESPACE, "-f", "-", "-o", "json",
            input=json.dumps(obj),
        ).stdout
    )  # fmt: skip


def test_the_api_server_takes_the_controller_on_either_allocator(kube, operator_chart) -> None:
    """controller.allocator's two renders of the controller's Deployment, as the API server
    stores them (a server-side dry run beside the installed release): jemalloc's preload, or
    pymalloc with the image's LD_PRELOAD emptied (the server keeps an empty value as none)."""
    expected = {
        "jemalloc": {"LD_PRELOAD": "libjemalloc.so.2", "PYTHONMALLOC": "malloc"},
        "pymalloc": {"LD_PRELOAD": None, "PYTHONMALLOC": "pymalloc", "MALLOC_ARENA_MAX": "2"},
    }
    for allocator, want in expected.items():
        deployment = rendered_object(
            kube, "alloc", "Deployment", f"controller.allocator={allocator}"
        )
        deployment["metadata"]["name"] = f"megdet-allocator-{allocator}"
        stored = stored_by_dry_run(kube, deployment)
        (container,) = stored["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {name: env.get(name, "absent") for name in want} == want, allocator
        if allocator == "jemalloc":
            assert "MALLOC_ARENA_MAX" not in env


def test_the_api_server_takes_the_controllers_budget_and_network_policy(kube, operator_chart):
    """The PodDisruptionBudget (default values: two replicas) is installed with the release and
    covers both replicas; the NetworkPolicy (off by default) with the cluster's own API server
    addresses is stored as rendered (a server-side dry run beside the release)."""
    pdb = eventually(
        lambda: (p := get_json(kube, "pdb", "-n", OPERATOR_NAMESPACE, operator_chart))
        .get("status", {})
        .get("expectedPods")
        == 2
        and p,
        timeout=60,
        message="the controller's PodDisruptionBudget counting its two replicas",
    )
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    slices = get_json(
        kube, "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes"
    )
    addresses = sorted(a for s in slices["items"] for e in s["endpoints"] for a in e["addresses"])
    assert addresses, slices
    cidrs = ",".join(f"{a}/32" for a in addresses)
    policy = rendered_object(
        kube,
        operator_chart,
        "NetworkPolicy",
        "networkPolicy.enabled=true",
        f"networkPolicy.apiServer.cidrs={{{cidrs}}}",
    )
    stored = stored_by_dry_run(kube, policy)
    assert stored["spec"] == policy["spec"]
    assert stored["spec"]["egress"][0]["to"] == [
        {"ipBlock": {"cidr": f"{a}/32"}} for a in addresses
    ]
