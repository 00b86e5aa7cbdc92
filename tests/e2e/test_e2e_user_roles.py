"""megdet-edit / megdet-view on the real control plane: the controller-manager aggregates them
into the built-in edit/admin and view ClusterRoles, so a user whom a namespace's RoleBinding
gives `edit` may create MegDetRuns there, `view` may read them only, and neither reaches
another namespace. Checked by impersonation (`kubectl --as`), as the API server authorizes the
real user; megdetruns/privileged stays outside both."""

from __future__ import annotations

import yaml
from e2e_helpers import apply_objects, eventually, mdr, namespace

TEAM, OTHER = "rbac-team-e2e", "rbac-other-e2e"
EDITOR, VIEWER = "alice@example.com", "bob@example.com"
SPEC = {"gpus": 8, "dataset": {"claimName": "coco"}, "output": {"claimName": "out"}}


def as_user(kube, user: str, *args: str, **kwargs):
    return kube.kubectl(f"--as={user}", *args, check=False, **kwargs)


def can_i(kube, user: str, verb: str, resource: str, ns: str, *extra: str) -> bool:
    proc = as_user(kube, user, "auth", "can-i", verb, resource, "-n", ns, *extra)
    return proc.stdout.strip() == "yes"


def bind(kube, user: str, cluster_role: str, ns: str) -> None:
    apply_objects(
        kube,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{cluster_role}-{user.split('@')[0]}", "namespace": ns},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": cluster_role,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )


def test_edit_creates_view_reads_and_neither_crosses_namespaces(kube, operator_chart) -> None:
    namespace(kube, TEAM)
    namespace(kube, OTHER)
    bind(kube, EDITOR, "edit", TEAM)
    bind(kube, VIEWER, "view", TEAM)
    # The aggregation controller copies megdet-edit/-view into the built-in roles.
    eventually(
        lambda: can_i(kube, EDITOR, "create", "megdetruns.megdet.io", TEAM)
        and can_i(kube, VIEWER, "list", "megdetruns.megdet.io", TEAM),
        timeout=60,
        message="megdet-edit/-view aggregated into edit/view",
    )

    run = yaml.safe_dump(mdr("by-editor", TEAM, SPEC))
    created = as_user(kube, EDITOR, "create", "-f", "-", input=run)
    assert created.returncode == 0, created.stderr
    patched = as_user(
        kube, EDITOR, "label", "mdr", "by-editor", "-n", TEAM, "owner=alice", "--overwrite"
    )
    assert patched.returncode == 0, patched.stderr

    got = as_user(kube, VIEWER, "get", "mdr", "by-editor", "-n", TEAM, "-o", "name")
    assert got.returncode == 0 and got.stdout.strip() == "megdetrun.megdet.io/by-editor"
    assert (
        as_user(
            kube, VIEWER, "get", "mdr", "by-editor", "-n", TEAM, "--subresource=status"
        ).returncode
        == 0
    )
    denied = as_user(kube, VIEWER, "create", "-f", "-", input=yaml.safe_dump(mdr("v", TEAM, SPEC)))
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
    denied = as_user(kube, VIEWER, "delete", "mdr", "by-editor", "-n", TEAM)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr

    for user in (EDITOR, VIEWER):
        other = as_user(
            kube, user, "create", "-f", "-", input=yaml.safe_dump(mdr("x", OTHER, SPEC))
        )
        assert other.returncode != 0 and "forbidden" in other.stderr.lower(), other.stderr
        listed = as_user(kube, user, "get", "mdr", "-n", OTHER)
        assert listed.returncode != 0 and "forbidden" in listed.stderr.lower(), listed.stderr
        assert not can_i(kube, user, "get", "megdetruns.megdet.io", OTHER)

    # The privileged knobs' grant is never part of edit or view.
    for user in (EDITOR, VIEWER):
        assert not can_i(
            kube, user, "use", "megdetruns.megdet.io", TEAM, "--subresource=privileged"
        )
    assert as_user(kube, EDITOR, "delete", "mdr", "by-editor", "-n", TEAM).returncode == 0


def test_the_builtin_roles_carry_the_megdet_rules(kube, operator_chart) -> None:
    import json

    def rules(role: str) -> set[tuple[str, str, str]]:
        obj = json.loads(kube.kubectl("get", "clusterrole", role, "-o", "json").stdout)
        return {
            (group, resource, verb)
            for rule in obj.get("rules") or []
            for group in rule.get("apiGroups", [])
            for resource in rule.get("resources", [])
            for verb in rule["verbs"]
        }

    eventually(
        lambda: ("megdet.io", "megdetruns", "create") in rules("admin")
        and ("megdet.io", "megdetruns", "create") in rules("edit")
        and ("megdet.io", "megdetruns", "watch") in rules("view"),
        timeout=60,
        message="aggregated rules in admin, edit, view",
    )
    assert ("megdet.io", "megdetruns", "create") not in rules("view")
    for role in ("admin", "edit", "view"):
        assert not {r for r in rules(role) if r[1] == "megdetruns/privileged"}, role
