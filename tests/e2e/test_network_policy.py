"""A MegDetRun's NetworkPolicy on the real API server: the controller, under the operator
chart's ServiceAccount, creates it next to the job, owned by the run, patches it and deletes it
as the spec changes, and deletes it with the run; the CRD refuses an extraEgress rule that the
NetworkPolicy could not hold, and a refusal of the NetworkPolicy itself leaves the job the
run's."""

from __future__ import annotations

import json

from e2e_helpers import apply_objects, condition, eventually, get_json, get_or_none, mdr, namespace


def test_the_controller_creates_and_deletes_the_runs_network_policy(kube, controller) -> None:
    ns = namespace(kube, "netpol-e2e")
    apply_objects(kube, mdr("isolated", ns, {"gpus": 8, "networkPolicy": {"enabled": True}}))
    policy = eventually(
        lambda: get_or_none(kube, "networkpolicy", "-n", ns, "isolated"),
        message="the run's NetworkPolicy",
    )
    run = get_or_none(kube, "mdr", "-n", ns, "isolated")
    (owner,) = policy["metadata"]["ownerReferences"]
    assert owner["kind"] == "MegDetRun" and owner["uid"] == run["metadata"]["uid"]
    assert owner["controller"] is True
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector["app.kubernetes.io/instance"] == "isolated"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    eventually(lambda: get_or_none(kube, "pytorchjob", "-n", ns, "isolated"), message="the job")
    kube.kubectl("delete", "mdr", "-n", ns, "isolated", "--timeout=60s")
    eventually(
        lambda: get_or_none(kube, "networkpolicy", "-n", ns, "isolated") is None,
        message="the NetworkPolicy deleted with its run",
    )


def test_the_crd_refuses_an_extra_egress_rule_the_network_policy_could_not_hold(kube) -> None:
    """The CRD (the API server applied it, CEL rules and all) refuses at admission what would
    make the run's NetworkPolicy invalid, naming the field and what it must look like."""
    ns = namespace(kube, "netpol-schema-e2e")
    bad = {"to": [{"ipBlock": {"cidr": "10.20.0.0/33"}}]}
    for rule, field, words in (
        (bad, "spec.networkPolicy.extraEgress[0].to[0].ipBlock.cidr", "must be an IPv4 or IPv6"),
        (
            {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}, "podSelector": {}}]},
            "spec.networkPolicy.extraEgress[0].to[0].ipBlock",
            "ipBlock stands alone",
        ),
        ({"ports": [{"port": 9000, "endPort": 80}]}, "extraEgress[0].ports[0].endPort", "at least"),
    ):
        policy = {"enabled": True, "restrictEgress": True, "extraEgress": [rule]}
        refused = apply_objects(
            kube, mdr("bad-egress", ns, {"gpus": 8, "networkPolicy": policy}), check=False
        )
        assert refused.returncode != 0, refused.stdout
        assert field in refused.stderr and words in refused.stderr, refused.stderr
    assert get_or_none(kube, "mdr", "-n", ns, "bad-egress") is None


def test_the_network_policy_follows_the_spec_and_a_refusal_of_it_leaves_the_job(
    kube, controller
) -> None:
    """Edits of a run with a job: the NetworkPolicy is patched (egress rules on), a rule only
    the NetworkPolicy's own validation refuses (an except outside its cidr) is ChildrenReady=
    False while the job stays Created, and turning the policy off deletes it."""
    ns = namespace(kube, "netpol-edit-e2e")
    apply_objects(kube, mdr("edited", ns, {"gpus": 8, "networkPolicy": {"enabled": True}}))
    created = eventually(
        lambda: get_or_none(kube, "networkpolicy", "-n", ns, "edited"), message="the policy"
    )
    eventually(
        lambda: (get_or_none(kube, "mdr", "-n", ns, "edited") or {})
        .get("status", {})
        .get("jobUID"),
        message="the run's job recorded",
    )
    job_uid = get_json(kube, "pytorchjob", "-n", ns, "edited")["metadata"]["uid"]

    def edit(network_policy: dict) -> None:
        patch = json.dumps({"spec": {"networkPolicy": network_policy}})
        kube.kubectl("patch", "mdr", "edited", "-n", ns, "--type=merge", "-p", patch)

    rule = {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 443}]}
    edit({"restrictEgress": True, "extraEgress": [rule]})
    updated = eventually(
        lambda: (p := get_or_none(kube, "networkpolicy", "-n", ns, "edited"))
        and "Egress" in p["spec"]["policyTypes"]
        and p,
        message="the policy patched",
    )
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]
    assert {**rule, "ports": [{"port": 443, "protocol": "TCP"}]} in updated["spec"]["egress"]

    # The API server's NetworkPolicy validation (not the CRD's) refuses this one.
    outside = {"to": [{"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.30.0.0/24"]}}]}
    edit({"restrictEgress": True, "extraEgress": [outside]})
    ready = eventually(
        lambda: (c := condition(get_or_none(kube, "mdr", "-n", ns, "edited"), "ChildrenReady"))
        and c["status"] == "False"
        and c,
        message="ChildrenReady=False",
    )
    assert ready["reason"] == "ChildRefused" and "HTTP 422" in ready["message"], ready
    run = get_json(kube, "mdr", "-n", ns, "edited")
    assert condition(run, "Created")["status"] == "True", run["status"]
    assert run["status"]["phase"] != "Failed" and run["status"]["jobUID"] == job_uid
    assert get_json(kube, "pytorchjob", "-n", ns, "edited")["metadata"]["uid"] == job_uid

    # Off: the policy goes; the job stays.
    edit({"enabled": False, "restrictEgress": False, "extraEgress": []})
    eventually(
        lambda: get_or_none(kube, "networkpolicy", "-n", ns, "edited") is None,
        message="the policy deleted with the spec",
    )
    assert get_json(kube, "pytorchjob", "-n", ns, "edited")["metadata"]["uid"] == job_uid
    eventually(
        lambda: (
            condition(get_or_none(kube, "mdr", "-n", ns, "edited"), "ChildrenReady") or {}
        ).get("status")
        == "True",
        message="ChildrenReady=True",
    )
