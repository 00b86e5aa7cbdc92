"""Pod security: the run's pods meet the `restricted` Pod Security Standard by default, on both
targets; nccl.ib.memlock=root and network.hostNetwork differ from that exactly as documented
(docs/helm.md, "Pod security") and need `privileged`; NOTES names the level and what needs it.

The checks are tests/chart/pod_security.py's. Its verdicts on the CASES below were compared with
Kubernetes' own implementation (k8s.io/pod-security-admission v0.36.3, policy.NewEvaluator with
DefaultChecks at version "latest", fed the same rendered pod templates as JSON): all 64 pod
templates (32 cases x 2 targets) agreed, and the expected levels recorded here are that
library's verdicts. (The Go library is not a dependency of the tests; the comparison was a
one-off.)
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from chart_helpers import (
    ALL_CI_VALUES,
    CHART_DIR,
    RESTRICTED_CONTAINER_SECURITY,
    ROOT_CONTAINER_SECURITY,
    diff_paths,
    values_file,
)
from pod_security import RESTRICTED_VOLUMES, level, violations

REPO = CHART_DIR.parents[1]
TARGETS = ("pytorchjob", "trainjob")
IB = {"enabled": True, "rdmaResourceName": "rdma/rdma_shared_device_a"}


def pods_of(render, values: dict[str, Any], target: str) -> list[dict[str, Any]]:
    """Every pod template the release renders for the target (PyTorchJob replicas, or the
    TrainingRuntime's trainer job)."""
    objects = render({**copy.deepcopy(values), "target": target}).objects
    kinds = {o["kind"]: o for o in objects}
    if target == "pytorchjob":
        return [r["template"] for r in kinds["PyTorchJob"]["spec"]["pytorchReplicaSpecs"].values()]
    jobs = kinds["TrainingRuntime"]["spec"]["template"]["spec"]["replicatedJobs"]
    return [j["template"]["spec"]["template"] for j in jobs]


# --- the default: restricted --------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("gpus", [1, 16])
def test_default_pods_meet_every_restricted_field(render, target, gpus):
    pods = pods_of(render, {"gpus": gpus}, target)
    assert len(pods) == (2 if gpus == 16 and target == "pytorchjob" else 1)
    for pod in pods:
        spec = pod["spec"]
        # Pod level: non-root as the image's user, the runtime's seccomp profile, no token.
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 10001
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert key not in spec
        # Container level: every restricted field, and nothing else.
        (container,) = spec["containers"]
        sc = container["securityContext"]
        assert sc == RESTRICTED_CONTAINER_SECURITY
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["runAsNonRoot"] is True
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not any(p.get("hostPort") for p in container.get("ports", []))
        # Volumes: PVCs and the memory-backed emptyDir only.
        for volume in spec["volumes"]:
            assert set(volume) - {"name"} <= RESTRICTED_VOLUMES
        assert violations(pod) == {}
        assert level(pod) == "restricted"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("path", ALL_CI_VALUES, ids=lambda p: p.name)
def test_ci_examples_state_their_level(render, target, path):
    # The host-network example takes locked memory as root too: privileged; the rest are
    # restricted (the multi-node IB example gets locked memory from the runtime).
    expected = "privileged" if path.name == "hostnetwork-values.yaml" else "restricted"
    for pod in pods_of(render, values_file(path), target):
        assert level(pod) == expected
    notes = render({**values_file(path), "target": target}).notes
    assert f"the pods {'meet' if expected == 'restricted' else 'need'} the `{expected}` level" in (
        notes.replace("\n", " ")
    )


# --- the two modes that need privileged, exactly as documented ----------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_root_memlock_differs_exactly_as_documented(render, target):
    (runtime,) = pods_of(render, {"nccl": {"ib": {**IB, "memlock": "runtime"}}}, target)[:1]
    (root,) = pods_of(render, {"nccl": {"ib": {**IB, "memlock": "root"}}}, target)[:1]
    sc = ("spec", "containers", 0, "securityContext")
    # docs/helm.md: uid 0, runAsNonRoot false, IPC_LOCK added, NET_RAW dropped instead of ALL
    # (root gets the runtime's default capabilities back but NET_RAW); nothing else changes.
    assert diff_paths(runtime, root) == {
        (*sc, "runAsUser"),
        (*sc, "runAsNonRoot"),
        (*sc, "capabilities", "add"),
        (*sc, "capabilities", "drop", 0),
    }
    assert root["spec"]["containers"][0]["securityContext"] == ROOT_CONTAINER_SECURITY
    assert level(runtime) == "restricted"
    # baseline allows no IPC_LOCK; restricted also forbids root and a kept capability set.
    assert violations(root) == {
        "capabilities_baseline": "baseline",
        "capabilities_restricted": "restricted",
        "runAsNonRoot": "restricted",
        "runAsUser": "restricted",
    }
    assert level(root) == "privileged"


@pytest.mark.parametrize("target", TARGETS)
def test_host_network_differs_exactly_as_documented(render, target):
    (default,) = pods_of(render, {}, target)[:1]
    (host,) = pods_of(render, {"network": {"hostNetwork": True}}, target)[:1]
    assert diff_paths(default, host) == {("spec", "hostNetwork"), ("spec", "dnsPolicy")}
    # baseline forbids host namespaces; everything else stays restricted.
    assert violations(host) == {"hostNamespaces": "baseline"}
    assert level(host) == "privileged"


def test_notes_say_which_level_each_mode_needs_and_why(render):
    notes = render({"nccl": {"ib": {**IB, "memlock": "root"}}}).notes
    assert "the pods need the `privileged` level" in notes
    assert "pod-security.kubernetes.io/enforce=privileged on vision" in notes
    assert "Baseline forbids:\n  - nccl.ib.memlock=root: capabilities.add IPC_LOCK" in notes
    assert "nccl.ib.memlock=root: runs as root (runAsUser 0)" in notes
    notes = render({"network": {"hostNetwork": True}}).notes
    assert "Baseline forbids:\n  - network.hostNetwork=true (host namespaces)\n" in notes
    assert "Restricted" not in notes
    notes = render({}).notes
    assert "Pod Security: the pods meet the `restricted` level" in notes


# --- levels for other values, as Kubernetes' implementation judged them ------------------------

CASES: list[tuple[str, dict[str, Any], str]] = [
    ("defaults", {}, "restricted"),
    ("ib-runtime", {"nccl": {"ib": {**IB, "memlock": "runtime"}}}, "restricted"),
    ("ib-root", {"nccl": {"ib": {**IB, "memlock": "root"}}}, "privileged"),
    ("hostnetwork", {"network": {"hostNetwork": True}}, "privileged"),
    ("no-container-context", {"containerSecurityContext": None}, "baseline"),
    ("no-pod-context", {"podSecurityContext": None}, "restricted"),
    ("no-contexts", {"containerSecurityContext": None, "podSecurityContext": None}, "baseline"),
    ("escalation", {"containerSecurityContext": {"allowPrivilegeEscalation": True}}, "baseline"),
    ("non-root-from-pod", {"containerSecurityContext": {"runAsNonRoot": None}}, "restricted"),
    (
        "non-root-nowhere",
        {"containerSecurityContext": {"runAsNonRoot": None}, "podSecurityContext": None},
        "baseline",
    ),
    ("root-uid", {"containerSecurityContext": {"runAsUser": 0}}, "baseline"),
    ("pod-root-uid", {"podSecurityContext": {"runAsUser": 0}}, "baseline"),
    (
        "privileged",
        {"containerSecurityContext": {"privileged": True, "allowPrivilegeEscalation": None}},
        "privileged",
    ),
    (
        "net-bind-service",
        {"containerSecurityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}},
        "restricted",
    ),
    (
        "net-admin",
        {"containerSecurityContext": {"capabilities": {"add": ["NET_ADMIN"]}}},
        "privileged",
    ),
    ("chown", {"containerSecurityContext": {"capabilities": {"add": ["CHOWN"]}}}, "baseline"),
    (
        "drop-not-all",
        {"containerSecurityContext": {"capabilities": {"drop": ["NET_RAW"]}}},
        "baseline",
    ),
    (
        "seccomp-unconfined",
        {"containerSecurityContext": {"seccompProfile": {"type": "Unconfined"}}},
        "privileged",
    ),
    (
        "seccomp-localhost",
        {
            "containerSecurityContext": {
                "seccompProfile": {"type": "Localhost", "localhostProfile": "p"}
            }
        },
        "restricted",
    ),
    ("seccomp-from-pod", {"containerSecurityContext": {"seccompProfile": None}}, "restricted"),
    (
        "seccomp-nowhere",
        {
            "containerSecurityContext": {"seccompProfile": None},
            "podSecurityContext": {"seccompProfile": None},
        },
        "baseline",
    ),
    (
        "pod-seccomp-unconfined",
        {"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}},
        "privileged",
    ),
    ("proc-unmasked", {"containerSecurityContext": {"procMount": "Unmasked"}}, "privileged"),
    (
        "apparmor-unconfined",
        {"containerSecurityContext": {"appArmorProfile": {"type": "Unconfined"}}},
        "privileged",
    ),
    (
        "selinux-spc",
        {"containerSecurityContext": {"seLinuxOptions": {"type": "spc_t"}}},
        "privileged",
    ),
    (
        "selinux-level",
        {"containerSecurityContext": {"seLinuxOptions": {"level": "s0:c1"}}},
        "restricted",
    ),
    (
        "unsafe-sysctl",
        {"podSecurityContext": {"sysctls": [{"name": "net.core.somaxconn", "value": "1"}]}},
        "privileged",
    ),
    (
        "hostpath",
        {
            "extraVolumes": [{"name": "h", "hostPath": {"path": "/x"}}],
            "extraVolumeMounts": [{"name": "h", "mountPath": "/h"}],
        },
        "privileged",
    ),
    ("nfs", {"extraVolumes": [{"name": "n", "nfs": {"server": "s", "path": "/x"}}]}, "baseline"),
    ("configmap", {"extraVolumes": [{"name": "c", "configMap": {"name": "c"}}]}, "restricted"),
    (
        "apparmor-annotation",
        {
            "podAnnotations": {
                "container.apparmor.security.beta.kubernetes.io/pytorch": "unconfined"
            }
        },
        "privileged",
    ),
    (
        "root-keeps-other-drops",
        {
            "nccl": {"ib": {**IB, "memlock": "root"}},
            "containerSecurityContext": {"capabilities": {"drop": ["ALL", "NET_RAW"]}},
        },
        "privileged",
    ),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("values", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_level_and_notes_agree_with_pod_security_admission(render, target, values, expected):
    rendered = render({**copy.deepcopy(values), "target": target})
    for pod in pods_of(render, values, target):
        assert level(pod) == expected, violations(pod)
    verb = "meet" if expected == "restricted" else "need"
    assert f"the pods {verb} the `{expected}` level" in rendered.notes


# --- containerSecurityContext ------------------------------------------------------------------


def container_security(render, values: dict[str, Any]) -> dict[str, Any] | None:
    (pod, *_) = pods_of(render, values, "pytorchjob")
    return pod["spec"]["containers"][0].get("securityContext")


def test_container_security_context_merges_over_the_secure_defaults(render):
    assert container_security(render, {"containerSecurityContext": {}}) == (
        RESTRICTED_CONTAINER_SECURITY
    )
    merged = container_security(
        render, {"containerSecurityContext": {"readOnlyRootFilesystem": True}}
    )
    assert merged == {**RESTRICTED_CONTAINER_SECURITY, "readOnlyRootFilesystem": True}
    # Maps merge key by key (drop ALL stays); a key set to null goes.
    caps = {"containerSecurityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}}
    assert container_security(render, caps)["capabilities"] == {
        "add": ["NET_BIND_SERVICE"],
        "drop": ["ALL"],
    }
    no_seccomp = container_security(render, {"containerSecurityContext": {"seccompProfile": None}})
    assert "seccompProfile" not in no_seccomp
    # null for the whole value: no securityContext on the container at all.
    assert container_security(render, {"containerSecurityContext": None}) is None


@pytest.mark.parametrize("target", TARGETS)
def test_root_memlock_on_the_host_network_drops_net_raw(render, target):
    # ci/hostnetwork-values.yaml: root with the runtime's default capabilities, on the node's
    # network; NET_RAW there would let the trainer craft and sniff packets on the node's
    # interfaces, and nothing of NCCL's needs it (RDMA RC queue pairs; sockets are TCP).
    values = values_file(CHART_DIR / "ci" / "hostnetwork-values.yaml")
    for pod in pods_of(render, values, target):
        assert pod["spec"]["hostNetwork"] is True
        caps = pod["spec"]["containers"][0]["securityContext"]["capabilities"]
        assert "NET_RAW" in caps["drop"] and "NET_RAW" not in caps.get("add", [])
    # A platform that adds NET_RAW on purpose keeps it.
    added = {**values, "containerSecurityContext": {"capabilities": {"add": ["NET_RAW"]}}}
    for pod in pods_of(render, added, target):
        caps = pod["spec"]["containers"][0]["securityContext"]["capabilities"]
        assert caps == {"add": ["NET_RAW", "IPC_LOCK"]}


def test_root_memlock_keeps_the_platforms_other_capability_settings(render):
    values = {
        "nccl": {"ib": {**IB, "memlock": "root"}},
        "containerSecurityContext": {
            "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL", "NET_RAW"]},
            "readOnlyRootFilesystem": True,
        },
    }
    sc = container_security(render, values)
    assert sc["capabilities"] == {"add": ["NET_BIND_SERVICE", "IPC_LOCK"], "drop": ["NET_RAW"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert (sc["runAsUser"], sc["runAsNonRoot"]) == (0, False)
    # Without IB, memlock=root changes nothing.
    assert container_security(render, {"nccl": {"ib": {"memlock": "root"}}}) == (
        RESTRICTED_CONTAINER_SECURITY
    )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"containerSecurityContext": {"runAsNonroot": True}},
            "at '/containerSecurityContext': additional properties 'runAsNonroot' not allowed",
        ),
        (
            {"containerSecurityContext": {"seccompProfile": {"type": "Default"}}},
            "at '/containerSecurityContext/seccompProfile/type': value must be one of "
            "'RuntimeDefault', 'Localhost', 'Unconfined'",
        ),
        (
            {"containerSecurityContext": {"allowPrivilegeEscalation": "no"}},
            "at '/containerSecurityContext/allowPrivilegeEscalation': got string, want boolean",
        ),
        (
            {"containerSecurityContext": {"capabilities": {"drop": "ALL"}}},
            "at '/containerSecurityContext/capabilities/drop': got string, want array",
        ),
    ],
)
def test_schema_refuses_bad_security_values_naming_them(render, values, expected):
    assert expected in render.error(values)


# --- the checker has teeth ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "check", "at"),
    [
        (lambda p: p["spec"].update(hostPID=True), "hostNamespaces", "baseline"),
        (lambda p: sc(p).update(privileged=True), "privileged", "baseline"),
        (
            lambda p: sc(p)["capabilities"].update(add=["SYS_ADMIN"]),
            "capabilities_baseline",
            "baseline",
        ),
        (
            lambda p: p["spec"]["volumes"].append({"name": "x", "hostPath": {"path": "/"}}),
            "hostPathVolumes",
            "baseline",
        ),
        (
            lambda p: p["spec"]["containers"][0]["ports"][0].update(hostPort=9477),
            "hostPorts",
            "baseline",
        ),
        (lambda p: sc(p).update(procMount="Unmasked"), "procMount", "baseline"),
        (
            lambda p: sc(p).update(seccompProfile={"type": "Unconfined"}),
            "seccompProfile_baseline",
            "baseline",
        ),
        (
            lambda p: p["spec"]["volumes"].append({"name": "x", "nfs": {}}),
            "restrictedVolumes",
            "restricted",
        ),
        (lambda p: sc(p).pop("allowPrivilegeEscalation"), "allowPrivilegeEscalation", "restricted"),
        (lambda p: sc(p).update(runAsNonRoot=False), "runAsNonRoot", "restricted"),
        (lambda p: sc(p).update(runAsUser=0), "runAsUser", "restricted"),
        (lambda p: sc(p).update(capabilities={}), "capabilities_restricted", "restricted"),
    ],
)
def test_the_checker_notices_each_kind_of_violation(render, change, check, at):
    (pod, *_) = pods_of(render, {}, "pytorchjob")
    pod = copy.deepcopy(pod)
    change(pod)
    assert violations(pod).get(check) == at


def sc(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]["securityContext"]


def test_docs_state_the_level_each_mode_needs():
    docs = (REPO / "docs" / "helm.md").read_text()
    section = docs[docs.index("## Pod security") :]
    section = section[: section.index("\n## ", 1)]
    for text in ("restricted", "`nccl.ib.memlock: root`", "`network.hostNetwork: true`"):
        assert text in section
    assert section.count("`privileged`") >= 2
