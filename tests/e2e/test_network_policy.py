"""A MegDetRun's NetworkPolicy on the real API server: the controller, under the operator
chart's ServiceAccount, creates it next to the job, owned by the run, and deletes it with the
run."""

from __future__ import annotations

from e2e_helpers import apply_objects, eventually, get_or_none, mdr, namespace


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
