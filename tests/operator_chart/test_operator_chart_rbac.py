"""The ClusterRole is least privilege: exactly these rules, no secrets, no wildcards.

tests/controller/test_operator_rbac.py checks the same rules against every API call the
controller makes against kmock (each call allowed, each rule used).
"""

from __future__ import annotations

from operator_chart_helpers import RELEASE, render

#: (apiGroup, resource) -> verbs. The one place a reviewer reads what the controller may do.
EXPECTED_RULES = {
    ("megdet.io", "megdetruns"): {"get", "list", "watch", "patch"},
    ("megdet.io", "megdetruns/status"): {"patch"},
    ("megdet.io", "megdetruns/finalizers"): {"update"},
    # The jobs and runtimes it makes: a job is deleted by it only to resize an elastic run
    # (then created again); the garbage collector deletes them with their run.
    ("kubeflow.org", "pytorchjobs"): {"get", "list", "watch", "create", "patch", "delete"},
    ("trainer.kubeflow.org", "trainjobs"): {"get", "list", "watch", "create", "patch", "delete"},
    ("trainer.kubeflow.org", "trainingruntimes"): {"get", "create", "patch"},
    ("networking.k8s.io", "networkpolicies"): {"get", "create", "patch", "delete"},
    ("", "events"): {"create"},
    # The runs' pods, read only: watched for why they cannot start (PodsStarted); the pod a
    # progress report's token is bound to, read.
    ("", "pods"): {"list", "watch"},
    # Kueue's Workloads of the runs' jobs, read only: a queued run's Admitted condition.
    ("kueue.x-k8s.io", "workloads"): {"list", "watch"},
    # Progress reporting: the endpoint's CA, published as one ConfigMap name per namespace and
    # watched (by that name) to write it back.
    ("", "configmaps"): {"create"},
    ("", "configmaps[megdet-progress-ca]"): {"patch", "list", "watch"},
    ("kopf.dev", "clusterkopfpeerings"): {"list", "watch", "patch"},
}


#: Serving only controller.watchNamespaces: the same, as a Role in each namespace, peering there
#: through a namespaced KopfPeering.
EXPECTED_NAMESPACED_RULES = {
    **{key: verbs for key, verbs in EXPECTED_RULES.items() if key[1] != "clusterkopfpeerings"},
    ("kopf.dev", "kopfpeerings"): {"list", "watch", "patch"},
}


def rules_of(rendered, role: dict | None = None) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    # The controller's own ClusterRole: the user-facing, metrics and other roles the chart
    # ships are checked in test_operator_chart_roles.py and where they are defined.
    for rule in (role or rendered.named("ClusterRole", RELEASE))["rules"]:
        # No nonResourceURLs; resourceNames only where the key says so ("resource[name]").
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}
        names = rule.get("resourceNames")
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = f"{resource}[{','.join(names)}]" if names else resource
                out.setdefault((group, key), set()).update(rule["verbs"])
    return out


def test_cluster_role_lists_exactly_what_the_controller_uses() -> None:
    assert rules_of(render()) == EXPECTED_RULES


def test_no_wildcards_no_secrets_no_escalation() -> None:
    rules = rules_of(render())
    for (group, resource), verbs in rules.items():
        assert "*" not in group and "*" not in resource and "*" not in verbs
        assert resource not in ("secrets", "pods/exec", "serviceaccounts/token")
        # ConfigMaps: create, and read or change only the one the controller publishes.
        if resource == "configmaps":
            assert verbs == {"create"}
        assert not verbs & {"escalate", "bind", "impersonate"}


def test_the_release_namespace_role_is_the_shared_ca_secret_only() -> None:
    """In its own namespace only: create the shared CA Secret once and read that one (no list,
    no other Secret). No pods right: no replica labels its pod (every replica serves), and with
    a mounted certificate (progressCertSecret) there is no Role at all."""
    rendered = render()
    role = rendered.named("Role", f"{RELEASE}-progress")
    assert role["metadata"]["namespace"] == "megdet-system"
    assert rules_of(rendered, role) == {
        ("", "secrets"): {"create"},
        ("", "secrets[megdet-operator-progress-ca]"): {"get"},
    }
    rendered.assert_granted(rendered.named("RoleBinding", f"{RELEASE}-progress"), role)
    for values in ({"controller": {"progressCertSecret": "cert-manager-made"}},
                   {"controller": {"progressEnabled": False}}):  # fmt: skip
        rendered = render(values)
        assert not [r for r in rendered.of_kind("Role") + rendered.of_kind("RoleBinding")
                    if r["metadata"]["name"] == f"{RELEASE}-progress"]  # fmt: skip


def test_without_peering_the_peering_rule_is_gone() -> None:
    rules = rules_of(render({"replicaCount": 1, "controller": {"peering": {"enabled": False}}}))
    assert ("kopf.dev", "clusterkopfpeerings") not in rules


def test_binding_grants_the_role_to_the_controller_service_account() -> None:
    rendered = render()
    binding = rendered.named("ClusterRoleBinding", RELEASE)
    account = rendered.one("ServiceAccount")
    rendered.assert_granted(binding, rendered.named("ClusterRole", RELEASE))
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def test_watch_namespaces_get_a_role_each_and_nothing_cluster_wide() -> None:
    rendered = render({"controller": {"watchNamespaces": ["vision", "research"]}})
    # No cluster-wide grant of the run rules: the ClusterRoles left are the metrics server's
    # review rights (cluster-scoped by nature) and roles for others (test_operator_chart_roles.py).
    assert not [r for r in rendered.of_kind("ClusterRole") if r["metadata"]["name"] == RELEASE]
    assert RELEASE not in {b["roleRef"]["name"] for b in rendered.of_kind("ClusterRoleBinding")}
    # The run rules' Roles (the progress endpoint's Role in the release namespace is checked
    # in test_the_release_namespace_role_is_the_shared_ca_secret_and_the_pod_label).
    roles = {r["metadata"]["namespace"]: r for r in rendered.of_kind("Role")
             if r["metadata"]["name"] == RELEASE}  # fmt: skip
    bindings = {b["metadata"]["namespace"]: b for b in rendered.of_kind("RoleBinding")
                if b["metadata"]["name"] == RELEASE}  # fmt: skip
    peerings = {p["metadata"]["namespace"]: p for p in rendered.of_kind("KopfPeering")}
    assert set(roles) == set(bindings) == set(peerings) == {"vision", "research"}
    assert rendered.of_kind("ClusterKopfPeering") == []
    for namespace, role in roles.items():
        assert rules_of(rendered, role) == EXPECTED_NAMESPACED_RULES
        rendered.assert_granted(bindings[namespace], role)
    # The peering name the replicas are told is the one each namespace's object has.
    (container,) = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"]
    names = {p["metadata"]["name"] for p in peerings.values()}
    assert [f"--peering={name}" for name in names] == [
        a for a in container["args"] if a.startswith("--peering=")
    ]


def test_watch_namespaces_without_peering_drop_the_peering_rule() -> None:
    rendered = render(
        {
            "replicaCount": 1,
            "controller": {"watchNamespaces": ["vision"], "peering": {"enabled": False}},
        }
    )
    expected = {k: v for k, v in EXPECTED_NAMESPACED_RULES.items() if k[0] != "kopf.dev"}
    assert rules_of(rendered, rendered.named("Role", RELEASE)) == expected
    assert rendered.of_kind("KopfPeering") == []
    assert RELEASE not in {r["metadata"]["name"] for r in rendered.of_kind("ClusterRole")}
