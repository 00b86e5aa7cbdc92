"""The ClusterRole is least privilege: exactly these rules, no secrets, no wildcards.

tests/controller/test_operator_rbac.py checks the same rules against every API call the
controller makes against kmock (each call allowed, each rule used).
"""

from __future__ import annotations

from operator_chart_helpers import render

#: (apiGroup, resource) -> verbs. The one place a reviewer reads what the controller may do.
EXPECTED_RULES = {
    ("megdet.io", "megdetruns"): {"get", "list", "watch", "patch"},
    ("megdet.io", "megdetruns/status"): {"patch"},
    ("megdet.io", "megdetruns/finalizers"): {"update"},
    ("kubeflow.org", "pytorchjobs"): {"get", "list", "watch", "create", "patch", "delete"},
    ("trainer.kubeflow.org", "trainjobs"): {"get", "list", "watch", "create", "patch", "delete"},
    ("trainer.kubeflow.org", "trainingruntimes"): {"get", "list", "create", "delete"},
    ("", "events"): {"create"},
    ("kopf.dev", "clusterkopfpeerings"): {"list", "watch", "patch"},
}


def rules_of(rendered) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rendered.one("ClusterRole")["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}  # no nonResourceURLs, names
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_cluster_role_lists_exactly_what_the_controller_uses() -> None:
    assert rules_of(render()) == EXPECTED_RULES


def test_no_wildcards_no_secrets_no_escalation() -> None:
    rules = rules_of(render())
    for (group, resource), verbs in rules.items():
        assert "*" not in group and "*" not in resource and "*" not in verbs
        assert resource not in ("secrets", "configmaps", "pods/exec", "serviceaccounts/token")
        assert not verbs & {"escalate", "bind", "impersonate"}


def test_without_peering_the_peering_rule_is_gone() -> None:
    rules = rules_of(render({"replicaCount": 1, "controller": {"peering": {"enabled": False}}}))
    assert ("kopf.dev", "clusterkopfpeerings") not in rules


def test_binding_grants_the_role_to_the_controller_service_account() -> None:
    rendered = render()
    binding = rendered.one("ClusterRoleBinding")
    account = rendered.one("ServiceAccount")
    assert binding["roleRef"]["name"] == rendered.one("ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
