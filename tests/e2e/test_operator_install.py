"""`helm install megdet-operator charts/megdet-operator` on a real API server: the CRD is
accepted and served, `kubectl explain` reads its schema, and the controller, logged in as the
chart's ServiceAccount, does its work with no call refused and no call outside its role."""

from __future__ import annotations

import json

from e2e_helpers import CONTROLLER_USER, OPERATOR_NAMESPACE, eventually, get_json, helm

from megdet.controller.crd import PLURAL, build_crd


def test_crd_is_established_and_matches_the_generated_one(kube, operator_chart) -> None:
    crd = get_json(kube, "crd", f"{PLURAL}.megdet.io")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True", crd["status"]
    assert conditions.get("NamesAccepted") == "True", crd["status"]
    served = crd["spec"]["versions"][0]
    expected = build_crd()["spec"]["versions"][0]
    # The server kept every rule and printer column the generator wrote.
    assert served["additionalPrinterColumns"] == [
        {**c, **({"priority": c.get("priority", 0)})} for c in expected["additionalPrinterColumns"]
    ] or [c["name"] for c in served["additionalPrinterColumns"]] == [
        c["name"] for c in expected["additionalPrinterColumns"]
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
    denied = [
        (e["verb"], e.get("objectRef"), e["responseStatus"].get("code"))
        for e in kube.audit_events(CONTROLLER_USER)
        if e.get("stage") == "ResponseComplete" and e["responseStatus"].get("code") == 403
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
