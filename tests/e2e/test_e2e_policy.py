# ruff: noqa: E501 - the RBAC objects and the case table read best one entry per line
"""The cluster's MegDet policy on the real API server: the operator chart's
ValidatingAdmissionPolicy refuses a run outside the policy at `kubectl apply`, with the words the
controller uses (megdet/policy/ is the source of both), and the privileged knobs need both the
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

from megdet.policy import RULES, Policy, check, grant_message

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
    # The API server loads a new ValidatingAdmissionPolicy and its binding asynchronously:
    # until it has, a run outside the policy is admitted. Wait for a known refusal.
    probe = mdr("policy-loaded", name, {"gpus": 8, "image": {"repository": "docker.io/x/y"}})
    eventually(
        lambda: not create_as(kube, AUTHOR, probe)[0],
        message="the admission policy in force",
    )
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
    # Each gap the policy closes, refused, and its safe side, accepted.
    "apparmor-unconfined": {"podAnnotations": {"container.apparmor.security.beta.kubernetes.io/pytorch": "unconfined"}},
    "apparmor-localhost": {"podAnnotations": {"container.apparmor.security.beta.kubernetes.io/pytorch": "localhost/train", "user.megdet.io/team": "a"}},
    "apparmor-profile": {"podSecurityContext": {"runAsNonRoot": True, "appArmorProfile": {"type": "Unconfined"}}},
    "seccomp-annotation": {"podAnnotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}},
    "multus-default": {"podAnnotations": {"v1.multus-cni.io/default-network": "kube-system/flat"}},
    "multus-own": {"network": {"multusNetworks": "rdma-net@net1, other"}},
    "multus-foreign": {"network": {"multusNetworks": "own, kube-system/macvlan@net1"}},
    "multus-json": {"network": {"multusNetworks": '[{"name": "n", "namespace": "x"}]'}},
    "ld-preload": {"extraEnv": [{"name": "LD_PRELOAD", "value": "/cm/x.so"}]},
    "pythonpath": {"extraEnv": [{"name": "A", "value": "1"}, {"name": "PYTHONPATH", "value": "/cm"}, {"name": "PYTHONSTARTUP", "value": "/cm/s.py"}]},
    "safe-env": {"extraEnv": [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "NCCL_DEBUG", "value": "INFO"}]},
    "mount-output-subpath": {"extraVolumes": [{"name": "c", "emptyDir": {}}], "extraVolumeMounts": [{"name": "output", "mountPath": "/mnt/o", "subPath": "victim"}]},
    "mount-over-output": {"extraVolumes": [{"name": "c", "emptyDir": {}}], "extraVolumeMounts": [{"name": "c", "mountPath": "/output/victim"}]},
    "mount-dotdot": {"extraVolumes": [{"name": "c", "emptyDir": {}}], "extraVolumeMounts": [{"name": "c", "mountPath": "/x/../output"}]},
    "mount-elsewhere": {"extraVolumes": [{"name": "c", "emptyDir": {}}], "extraVolumeMounts": [{"name": "c", "mountPath": "/cache", "subPath": "x"}]},
    "output-claim-again": {"output": {"claimName": "shared"}, "extraVolumes": [{"name": "again", "persistentVolumeClaim": {"claimName": "shared"}}]},
    "gpu-resource": {"gpuResource": "squat.ai/kvm"},
    "rdma-resource": {"nccl": {"ib": {"enabled": True, "rdmaResourceName": "smarter-devices/fuse"}}},
    "rdma-allowed": {"nccl": {"ib": {"enabled": True, "rdmaResourceName": "rdma/rdma_shared_device_a"}}},
    "reserved-selector": {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}},
    "gpu-selector": {"nodeSelector": {"nvidia.com/gpu.product": "H100"}},
    "reserved-affinity": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "node-role.kubernetes.io/master", "operator": "Exists"}]}]}}}},
    "reserved-preferred": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "In", "values": ["x"]}]}}]}}},
    "avoid-reserved": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}]}]}, "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}},
    "pod-affinity-only": {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
    "label-outside": {"podLabels": {"app": "database"}},
    "label-inside": {"podLabels": {"user.megdet.io/team": "a"}},
    "annotation-outside": {"podAnnotations": {"sidecar.istio.io/inject": "true"}},
    "group-zero": {"podSecurityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 0}},
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
        "spec.podAnnotations",
        "spec.podLabels",
        "spec.network.multusNetworks",
        "spec.extraVolumeMounts",
        "spec.gpuResource",
        "spec.nccl.ib.rdmaResourceName",
        "spec.nodeSelector",
        "spec.affinity",
    }
    # And every rule of the policy: the server ran each CEL expression and message.
    rules = {rule.name for rule in RULES}
    fired = {
        rule.name
        for change in CASES.values()
        for rule in RULES
        if rule.check({"gpus": 8, **change}, policy)
    }
    assert rules - fired <= {"queues", "requireQueue"}, rules - fired  # need a listed policy


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


def patch_as(kube, user: str, ns: str, name: str, spec: dict[str, Any]):
    return kube.kubectl(
        "patch", "mdr", "-n", ns, name, "--type=merge", f"--as={user}",
        "-p", json.dumps({"spec": spec}), check=False,
    )  # fmt: skip


def test_a_run_the_policy_no_longer_allows_can_be_suspended_labelled_and_deleted(
    kube, ns, controller
) -> None:
    """After the policy was tightened again (the fixture above), the run stays: its metadata can
    change (kopf's annotations too), its owner can suspend and resume
    it, and it can be deleted; any other spec edit is checked against the policy as it is
    now."""
    run = get_or_none(kube, "mdr", "-n", ns, "hostnet")
    if run is None:
        pytest.fail("test_privileged_knobs_need_the_policy_and_the_grant made no run")
    kube.kubectl("label", "mdr", "-n", ns, "hostnet", "team=vision", f"--as={AUTHOR}")
    for suspend in (True, False):
        edit = patch_as(kube, AUTHOR, ns, "hostnet", {"runPolicy": {"suspend": suspend}})
        assert edit.returncode == 0, edit.stderr
        eventually(
            lambda s=suspend: (get_or_none(kube, "pytorchjob", "-n", ns, "hostnet") or {})
            .get("spec", {})
            .get("runPolicy", {})
            .get("suspend")
            is s,
            message=f"the job's suspend {suspend}",
        )
    # Any other change, even by the user holding the grant: the policy as it is now.
    edit = patch_as(kube, TRUSTED, ns, "hostnet", {"podLabels": {"user.megdet.io/team": "vision"}})
    assert edit.returncode != 0
    assert "policy.privileged.hostNetwork: false" in edit.stderr
    # suspend with another change in the same request is that other change.
    edit = patch_as(
        kube, TRUSTED, ns, "hostnet", {"runPolicy": {"suspend": True, "backoffLimit": 7}}
    )
    assert edit.returncode != 0 and "policy.privileged.hostNetwork: false" in edit.stderr
    kube.kubectl("delete", "mdr", "-n", ns, "hostnet", f"--as={AUTHOR}", "--timeout=60s")
    assert get_or_none(kube, "mdr", "-n", ns, "hostnet") is None
    eventually(
        lambda: get_or_none(kube, "pytorchjob", "-n", ns, "hostnet") is None,
        message="the job deleted with its run",
    )


def test_every_spec_update_is_checked_against_the_policy_but_suspend(kube, ns) -> None:
    """A run inside the policy, updated: each spec change is admitted only inside the policy
    as it is now (a loader variable, an output mount), suspend always."""
    accepted, said = create_as(kube, AUTHOR, mdr("updated", ns, {"gpus": 8}), dry_run=False)
    assert accepted, said
    try:
        env = [{"name": "LD_PRELOAD", "value": "/cm/x.so"}]
        edit = patch_as(kube, AUTHOR, ns, "updated", {"extraEnv": env})
        assert edit.returncode != 0
        assert 'spec.extraEnv: env "LD_PRELOAD" make the loader' in edit.stderr
        mounts = [{"name": "output", "mountPath": "/mnt/o", "subPath": "victim"}]
        edit = patch_as(kube, AUTHOR, ns, "updated", {"extraVolumeMounts": mounts})
        assert edit.returncode != 0 and "policy.outputMounts: false" in edit.stderr
        edit = patch_as(kube, AUTHOR, ns, "updated", {"podLabels": {"user.megdet.io/team": "a"}})
        assert edit.returncode == 0, edit.stderr
        edit = patch_as(kube, AUTHOR, ns, "updated", {"runPolicy": {"suspend": True}})
        assert edit.returncode == 0, edit.stderr
    finally:
        kube.kubectl("delete", "mdr", "-n", ns, "updated", "--wait=false")


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


# --- Each way round a deny list, refused by the API server itself --------------------------
# A researcher as the operator chart ships one: a ServiceAccount of the namespace bound to the
# chart's megdet-edit ClusterRole only (what `edit` aggregates), no grant. Each case is one
# server-side dry-run create; a refusal is matched on the field path and on the offending name
# the message must carry (the mount path, the variable, the key, the group field), not on whole
# messages, which the policy's rules own.
RESEARCHER = "researcher"
_CM = [{"name": "code", "configMap": {"name": "author-code"}}]


def _mount(path: str, sub_path: str | None = None) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": "code", "mountPath": path}
    if sub_path:
        mount["subPath"] = sub_path
    return {"extraVolumes": _CM, "extraVolumeMounts": [mount]}


_NONROOT = {"runAsNonRoot": True, "runAsUser": 1000}
BYPASSES: dict[str, tuple[dict[str, Any], str, str]] = {
    # case: (spec change, the field path refused, a word the refusal names)
    "tini-entrypoint": (_mount("/usr/bin/tini", "tini"), "spec.extraVolumeMounts", "/usr/bin/tini"),
    "venv-pth": (_mount("/opt/venv/lib/python3.12/site-packages/zz.pth", "zz.pth"), "spec.extraVolumeMounts", "site-packages/zz.pth"),
    "iopath-cache": (_mount("/home/megdet/.torch/iopath_cache/detectron2/ImageNetPretrained/MSRA/R-50.pkl", "r50"), "spec.extraVolumeMounts", "iopath_cache"),
    "env-path": ({"extraEnv": [{"name": "PATH", "value": "/mnt/code:/usr/bin"}]}, "spec.extraEnv", '"PATH"'),
    "env-fvcore-cache": ({"extraEnv": [{"name": "FVCORE_CACHE", "value": "/mnt/code"}]}, "spec.extraEnv", '"FVCORE_CACHE"'),
    "label-outside": ({"podLabels": {"security.istio.io/tlsMode": "istio"}}, "spec.podLabels", "security.istio.io/tlsMode"),
    "annotation-outside": ({"podAnnotations": {"sidecar.istio.io/inject": "true"}}, "spec.podAnnotations", "sidecar.istio.io/inject"),
    "fs-group-0": ({"podSecurityContext": {**_NONROOT, "fsGroup": 0}}, "spec.podSecurityContext", "fsGroup"),
    "run-as-group-0": ({"podSecurityContext": {**_NONROOT, "runAsGroup": 0}}, "spec.podSecurityContext", "runAsGroup"),
    "supplemental-group-0": ({"podSecurityContext": {**_NONROOT, "supplementalGroups": [1000, 0]}}, "spec.podSecurityContext", "supplementalGroups"),
}  # fmt: skip


@pytest.fixture(scope="module")
def researcher(kube, ns) -> str:
    """``system:serviceaccount:<ns>:researcher``, bound to the chart's megdet-edit role only."""
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": RESEARCHER, "namespace": ns},
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "researcher-edit", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "megdet-edit"},
        "subjects": [{"kind": "ServiceAccount", "name": RESEARCHER, "namespace": ns}],
    }  # fmt: skip
    apply_objects(kube, account, binding)
    return f"system:serviceaccount:{ns}:{RESEARCHER}"


@pytest.mark.parametrize("case", list(BYPASSES))
def test_the_server_refuses_each_way_round_the_policy(kube, ns, researcher, case) -> None:
    change, path, word = BYPASSES[case]
    accepted, said = create_as(kube, researcher, mdr(f"b-{case}", ns, {"gpus": 8, **change}))
    assert not accepted, f"{case}: the API server accepted it"
    assert "denied request" in said, said
    refusal = said[said.index(f"{path}: ") :] if f"{path}: " in said else ""
    assert refusal and word in refusal, said


def test_a_plain_run_with_a_config_map_under_mnt_is_accepted(kube, ns, researcher) -> None:
    accepted, said = create_as(
        kube, researcher, mdr("b-mnt", ns, {"gpus": 8, **_mount("/mnt/code")})
    )
    assert accepted, said
    assert json.loads(said)["spec"]["extraVolumeMounts"] == [
        {"name": "code", "mountPath": "/mnt/code"}
    ]
