# ruff: noqa: E501 - the RBAC objects and the case table read best one entry per line
"""The cluster's MegDet policy on the real API server: the operator chart's
ValidatingAdmissionPolicy refuses a run outside the policy at `kubectl apply`, with the words the
controller uses (megdet/policy.py is the source of both), and the privileged knobs need both the
policy and the grant (verb "use" on megdetruns/privileged), which the server's own authorizer
checks for the user who applies the run.

Users are impersonated (`kubectl --as`): the test's admin kubeconfig is in system:masters, which
every authorizer allows, so only an ordinary user shows the grant at work.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2e_helpers import (
    OPERATOR_NAMESPACE,
    OPERATOR_RELEASE,
    apply_objects,
    eventually,
    get_or_none,
    helm,
    mdr,
    namespace,
)

from megdet.policy import Policy, check, grant_message

NS = "policy-e2e"
AUTHOR = "alice"  # may create MegDetRuns in NS
TRUSTED = "bob"  # the same, and holds the grant for privileged knobs


@pytest.fixture(scope="module")
def ns(kube, operator_chart):
    name = namespace(kube, NS)
    rules = [{"apiGroups": ["megdet.io"], "resources": ["megdetruns"], "verbs": ["*"]}]
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "run-authors", "namespace": name},
        "rules": rules,
    }
    authors = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "run-authors", "namespace": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]},
        "subjects": [{"kind": "User", "name": u, "apiGroup": "rbac.authorization.k8s.io"} for u in (AUTHOR, TRUSTED)],
    }  # fmt: skip
    grant = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "privileged-runs", "namespace": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{OPERATOR_RELEASE}-privileged"},
        "subjects": [{"kind": "User", "name": TRUSTED, "apiGroup": "rbac.authorization.k8s.io"}],
    }  # fmt: skip
    apply_objects(kube, role, authors, grant)
    return name


def create_as(kube, user: str, obj: dict[str, Any], dry_run: bool = True) -> tuple[bool, str]:
    """Create ``obj`` as ``user``; (accepted, the server's refusal or the stored object)."""
    args = ["create", "-f", "-", f"--as={user}", "-o", "json"]
    if dry_run:
        args.append("--dry-run=server")
    proc = kube.kubectl(*args, input=json.dumps(obj), check=False)
    if proc.returncode == 0:
        return True, proc.stdout
    return False, proc.stderr.strip()


# A spec change each, inside or outside the default policy.
CASES: dict[str, dict[str, Any]] = {
    "chart-defaults": {},
    "image-elsewhere": {"image": {"repository": "docker.io/evil/miner"}},
    "image-ours": {"image": {"repository": "ghcr.io/megdet/megdet-nightly", "tag": "x"}},
    "service-account": {"serviceAccountName": "namespace-admin"},
    "secret-volume": {"extraVolumes": [{"name": "creds", "secret": {"secretName": "other-team"}}]},
    "claim-volume": {"extraVolumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}]},
    "host-path": {"extraVolumes": [{"name": "root", "hostPath": {"path": "/"}}]},
    "secret-env": {"extraEnv": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "o", "key": "k"}}}]},
    "plain-env": {"extraEnv": [{"name": "T", "value": "1"}]},
    "tolerate-all": {"tolerations": [{"operator": "Exists"}]},
    "tolerate-gpu": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
    "tolerate-control-plane": {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]},
    "host-network": {"network": {"hostNetwork": True}},
    "root-user": {"podSecurityContext": {"runAsUser": 0}},
    "no-pod-context": {"podSecurityContext": None},
    "sysctls": {"podSecurityContext": {"runAsNonRoot": True, "sysctls": [{"name": "net.core.somaxconn", "value": "1024"}]}},
    "priority": {"priorityClassName": "system-node-critical"},
    "gang-scheduler": {"gang": {"enabled": True, "schedulerName": "my-scheduler"}},
    "gang-queue": {"gang": {"enabled": True, "queue": "other-team"}},
    "gang-off": {"gang": {"enabled": False, "schedulerName": "my-scheduler"}},
    "ib-root": {"nccl": {"ib": {"enabled": True, "memlock": "root", "rdmaResourceName": "rdma/ib"}}},
    "kueue": {"kueue": {"queueName": "team-a"}},
}  # fmt: skip


def test_the_server_and_the_controller_give_one_verdict_in_the_same_words(kube, ns) -> None:
    policy = Policy()  # the chart's defaults, which operator_chart installed
    disagree = []
    for case, change in CASES.items():
        spec = {"gpus": 8, **change}
        accepted, said = create_as(kube, AUTHOR, mdr(f"p-{case}", ns, spec))
        problems = [f"{path}: {message}" for path, message in check(spec, policy)]
        if accepted:
            # What the controller will read: the stored spec, the CRD's defaults applied.
            problems = [f"{p}: {m}" for p, m in check(json.loads(said)["spec"], policy)]
        if accepted != (not problems) or (not accepted and not any(p in said for p in problems)):
            disagree.append((case, said if not accepted else "accepted", problems))
        if not accepted:
            assert "is forbidden" in said and "denied request" in said, said
    assert disagree == []
    # The cases cover every rule: each refused.
    refused = {p for change in CASES.values() for p, _ in check({"gpus": 8, **change}, policy)}
    assert refused == {
        "spec.image.repository",
        "spec.serviceAccountName",
        "spec.extraVolumes",
        "spec.extraEnv",
        "spec.tolerations",
        "spec.network.hostNetwork",
        "spec.podSecurityContext",
        "spec.priorityClassName",
        "spec.gang.schedulerName",
        "spec.gang.queue",
        "spec.nccl.ib.memlock",
    }


@pytest.fixture()
def host_network_allowed(kube, controller):
    """The operator chart upgraded to allow host networking (the controller restarted to read
    the new policy, as the Deployment's checksum annotation makes it), and put back after."""

    def upgrade(allowed: bool) -> None:
        helm(
            kube,
            "upgrade",
            OPERATOR_RELEASE,
            "charts/megdet-operator",
            "-n",
            OPERATOR_NAMESPACE,
            "--reuse-values",
            f"--set=policy.privileged.hostNetwork={str(allowed).lower()}",
            "--timeout=120s",
        )
        controller.restart()

    upgrade(True)
    try:
        yield
    finally:
        upgrade(False)


def test_privileged_knobs_need_the_policy_and_the_grant(
    kube, ns, controller, host_network_allowed
) -> None:
    run = mdr("hostnet", ns, {"gpus": 8, "network": {"hostNetwork": True}})
    accepted, said = create_as(kube, AUTHOR, run)
    assert not accepted
    assert f"spec.network.hostNetwork: {grant_message('hostNetwork')}" in said
    # Allowed by the policy is not allowed to everyone: the other knobs stay refused for both.
    accepted, said = create_as(
        kube, TRUSTED, mdr("rooted", ns, {"gpus": 8, "podSecurityContext": {"runAsUser": 0}})
    )
    assert not accepted and "policy.privileged.podSecurity: false" in said
    # The user holding the grant creates it for real, and the controller creates its job.
    accepted, said = create_as(kube, TRUSTED, run, dry_run=False)
    assert accepted, said
    job = eventually(
        lambda: get_or_none(kube, "pytorchjob", "-n", ns, "hostnet"), message="the PyTorchJob"
    )
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["hostNetwork"] is True


def test_a_run_the_policy_no_longer_allows_can_still_be_labelled_and_deleted(kube, ns) -> None:
    """After the policy was tightened again (the fixture above), the run stays: its metadata can
    change (the controller's finalizer and annotations too) and it can be deleted; its spec
    cannot be edited without the policy's leave."""
    run = get_or_none(kube, "mdr", "-n", ns, "hostnet")
    if run is None:
        pytest.fail("test_privileged_knobs_need_the_policy_and_the_grant made no run")
    kube.kubectl("label", "mdr", "-n", ns, "hostnet", "team=vision", f"--as={AUTHOR}")
    edit = kube.kubectl(
        "patch", "mdr", "-n", ns, "hostnet", "--type=merge", f"--as={TRUSTED}",
        "-p", json.dumps({"spec": {"runPolicy": {"suspend": True}}}), check=False,
    )  # fmt: skip
    assert edit.returncode != 0
    assert "policy.privileged.hostNetwork: false" in edit.stderr
    kube.kubectl("delete", "mdr", "-n", ns, "hostnet", f"--as={AUTHOR}", "--timeout=60s")
    assert get_or_none(kube, "mdr", "-n", ns, "hostnet") is None
    eventually(
        lambda: get_or_none(kube, "pytorchjob", "-n", ns, "hostnet") is None,
        message="the job deleted with its run",
    )


def test_the_chart_says_what_older_clusters_get(kube) -> None:
    """ValidatingAdmissionPolicy is GA from 1.30: on 1.28-1.29 the chart asks for
    policy.admission.enabled=false (the controller still enforces the policy)."""
    args = ["template", "x", "charts/megdet-operator", "--kube-version=1.29.0"]
    proc = helm(kube, *args, check=False)
    assert proc.returncode != 0
    assert "policy.admission.enabled=true needs ValidatingAdmissionPolicy" in proc.stderr
    assert "Set policy.admission.enabled=false" in proc.stderr
    ok = helm(kube, *args, "--set=policy.admission.enabled=false")
    assert "kind: ValidatingAdmissionPolicy" not in ok.stdout
    assert "name: x-megdet-operator-policy" in ok.stdout
