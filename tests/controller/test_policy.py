# ruff: noqa: E501 - the rule table reads best one case per line
"""The cluster's MegDet policy (megdet/policy/): its values, its rules, the generated admission
validations, and the controller refusing a run outside it before creating anything.

The admission side (the same rules as CEL in a ValidatingAdmissionPolicy, and the RBAC grant for
privileged knobs) runs on the real API server in tests/e2e/test_e2e_policy.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy import celtypes
from kmock_helpers import (
    PYTORCHJOBS,
    RUNS,
    apply,
    condition,
    counted,
    edit,
    events_for,
    eventually,
    get,
    patch,
    phase,
    reconciled,
    reconciles,
    requests_to,
    run_body,
    start_operator,
    stop_operator,
)

from megdet import policy as policy_module
from megdet.api import admission
from megdet.cli import UsageError
from megdet.controller import metrics
from megdet.controller.api import DROPPED_VALUES
from megdet.controller.daemon import load_policy
from megdet.policy import Policy, PolicyError, check
from tests.repo_files import OPERATOR_CHART as CHART


def problems(spec: dict[str, Any], policy: Policy | None = None) -> dict[str, str]:
    return dict(check(spec, policy or Policy()))


# ------------------------------------------------------------------------------------------
# The values.


def test_the_charts_defaults_are_the_modules_defaults() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["policy"]
    assert {k: v for k, v in values.items() if k != "admission"} == Policy().values()
    assert Policy.from_values(values) == Policy()


def test_the_generated_admission_validations_are_current() -> None:
    from megdet.api.crd import spec_schema

    committed = yaml.safe_load((CHART / "files" / "policy-validations.yaml").read_text())
    assert committed == admission.generated(spec_schema()), "run `make policy`"
    validations = committed["validations"]
    # Every rule and every way of using a knob with its grant, each naming its field.
    assert len(validations) == len(policy_module.RULES) + len(policy_module.KNOB_USES)
    assert {u.knob for u in policy_module.KNOB_USES} == set(Policy().values()["privileged"])
    for validation, rule in zip(validations, policy_module.RULES, strict=False):
        assert validation["messageExpression"].startswith(f"'{rule.path}: ' + ")


def test_the_admission_policy_compares_every_spec_field_but_suspend() -> None:
    """The matchCondition names each field of the CRD's spec (a field added to the CRD and
    not compared would let its changes past the policy) and runPolicy's but suspend."""
    from megdet.api.crd import spec_schema

    schema = spec_schema()
    (condition,) = admission.match_conditions(schema)
    expression = condition["expression"]
    assert expression.startswith("request.operation == 'CREATE' || (object.spec != oldObject")
    for field in schema["properties"]:
        if field != "runPolicy":
            assert f"object.spec.{field} == oldObject.spec.{field}" in expression, field
    for field in schema["properties"]["runPolicy"]["properties"]:
        compared = f"object.spec.runPolicy.{field} == oldObject.spec.runPolicy.{field}"
        assert (compared in expression) == (field != "suspend"), field


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"registries": ["x/"]}, "policy.registries: unknown key; allowed: "),
        ({"imageRepositories": "ghcr.io/"}, "policy.imageRepositories: must be a list of strings"),
        ({"secretRefs": "yes"}, "policy.secretRefs: must be true or false, got 'yes'"),
        (
            {"privileged": {"hostNetwork": 1}},
            "policy.privileged.hostNetwork: must be true or false",
        ),
        (
            {"privileged": {"root": True}},
            "policy.privileged.root: unknown key; allowed: hostNetwork",
        ),
        ({"privileged": []}, "policy.privileged: must be a mapping"),
        ({"loaderEnv": "no"}, "policy.loaderEnv: must be true or false, got 'no'"),
        (
            {"mountPrefixes": ["/mnt"]},
            "policy.mountPrefixes: '/mnt' is not a normalized absolute folder",
        ),
        ({"mountPrefixes": ["/a//b/"]}, "policy.mountPrefixes: '/a//b/' is not a normalized"),
        ({"mountPrefixes": ["/mnt/../"]}, "policy.mountPrefixes: '/mnt/../' is not a normalized"),
        ({"mountPrefixes": ["mnt/"]}, "policy.mountPrefixes: 'mnt/' is not"),
        ({"envNames": ["[A-Z"]}, "policy.envNames: '[A-Z' is not a regular expression"),
        (
            {"envNames": ["^(?!LD_).*$"]},
            "policy.envNames: '^(?!LD_).*$' uses lookaround or a backreference",
        ),
        ({"labelPrefixes": "user/"}, "policy.labelPrefixes: must be a list of strings"),
        ({"gpuResources": "nvidia.com/gpu"}, "policy.gpuResources: must be a list of strings"),
        (
            {"reservedNodeLabels": ["a=b=c"]},
            "policy.reservedNodeLabels: 'a=b=c' is not a label key or key=value",
        ),
        ([1], "policy: must be a mapping"),
    ],
)
def test_a_bad_policy_value_names_the_key_and_what_it_takes(values: Any, error: str) -> None:
    with pytest.raises(PolicyError, match="^" + re.escape(error)):
        Policy.from_values(values)


def test_the_controller_flag_reads_json_or_yaml_and_names_what_is_wrong(tmp_path: Path) -> None:
    assert load_policy(None) == Policy()
    good = tmp_path / "policy.json"
    good.write_text(json.dumps({"imageRepositories": ["*"], "privileged": {"hostNetwork": True}}))
    loaded = load_policy(good)
    assert loaded.imageRepositories == ("*",) and loaded.privileged.hostNetwork
    assert loaded.serviceAccounts == ("",)  # a key left out keeps its default
    bad = tmp_path / "bad.yaml"
    bad.write_text("queues: q1\n")
    with pytest.raises(
        UsageError, match=r"--policy-file .*bad.yaml: policy.queues: must be a list"
    ):
        load_policy(bad)
    with pytest.raises(UsageError, match=r"--policy-file .*missing.json: No such file"):
        load_policy(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{imageRepositories: [")
    with pytest.raises(UsageError, match="not JSON or YAML"):
        load_policy(broken)


# ------------------------------------------------------------------------------------------
# The rules.

SECURE = {
    "gpus": 16,
    "image": {"repository": "ghcr.io/megdet/megdet", "tag": "1.0"},
    "serviceAccountName": "",
    "extraVolumes": [{"name": "cache", "emptyDir": {}}],
    "extraEnv": [{"name": "A", "value": "1"}, {"name": "P", "valueFrom": {"fieldRef": {}}}],
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
    "podSecurityContext": {"runAsUser": 10001, "runAsNonRoot": True},
    "gang": {"enabled": False, "schedulerName": "anything", "queue": "any"},
    "kueue": {"queueName": "team-a"},
}


def test_the_chart_defaults_and_a_restricted_run_pass_the_default_policy() -> None:
    assert problems({}) == {}
    assert problems(SECURE) == {}


#: A spec change each rule refuses: (change, field, words its message holds).
REFUSED: list[tuple[dict[str, Any], str, str]] = [
    ({"image": {"repository": "docker.io/evil/miner"}}, "spec.image.repository", "policy.imageRepositories"),
    ({"image": {"repository": "ghcr.io/megdetx/y"}}, "spec.image.repository", '"ghcr.io/megdet/"'),
    ({"serviceAccountName": "admin"}, "spec.serviceAccountName", 'ServiceAccount "admin"'),
    ({"extraVolumes": [{"name": "s", "secret": {"secretName": "x"}}]}, "spec.extraVolumes", 'volumes "s"'),
    ({"extraVolumes": [{"name": "p", "projected": {}}]}, "spec.extraVolumes", "policy.volumeTypes"),
    ({"extraEnv": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "o"}}}]}, "spec.extraEnv", 'env "T" read Secrets'),
    ({"priorityClassName": "system-node-critical"}, "spec.priorityClassName", "policy.priorityClasses: none"),
    ({"tolerations": [{"operator": "Exists"}]}, "spec.tolerations", 'taint keys ""'),
    ({"tolerations": [{"key": "node-role.kubernetes.io/control-plane"}]}, "spec.tolerations", "control-plane"),
    ({"gang": {"enabled": True, "schedulerName": "mine"}}, "spec.gang.schedulerName", 'scheduler "mine"'),
    ({"gang": {"enabled": True, "queue": "other-team"}}, "spec.gang.queue", 'Volcano queue "other-team"'),
    ({"network": {"hostNetwork": True}}, "spec.network.hostNetwork", "policy.privileged.hostNetwork: false"),
    ({"nccl": {"ib": {"enabled": True, "memlock": "root"}}}, "spec.nccl.ib.memlock", "policy.privileged.ibRootMode"),
    ({"podSecurityContext": {"runAsUser": 0}}, "spec.podSecurityContext", "policy.privileged.podSecurity"),
    ({"podSecurityContext": {"runAsNonRoot": False}}, "spec.podSecurityContext", "restricted profile"),
    ({"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}}, "spec.podSecurityContext", "Unconfined"),
    ({"podSecurityContext": {"sysctls": [{"name": "net.core.somaxconn"}]}}, "spec.podSecurityContext", "sysctls"),
    ({"extraVolumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "spec.extraVolumes", "policy.privileged.hostPath"),
    # AppArmor or seccomp unconfined by annotation, as by podSecurityContext.
    ({"podAnnotations": {"container.apparmor.security.beta.kubernetes.io/pytorch": "unconfined"}}, "spec.podAnnotations", "policy.privileged.podSecurity: false"),
    ({"podAnnotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}}, "spec.podAnnotations", "AppArmor or seccomp"),
    ({"podSecurityContext": {"appArmorProfile": {"type": "Unconfined"}}}, "spec.podSecurityContext", "policy.privileged.podSecurity"),
    # Multus: a replaced default network, another namespace's network, the JSON form.
    ({"podAnnotations": {"v1.multus-cni.io/default-network": "kube-system/flat"}}, "spec.podAnnotations", "policy.multusDefaultNetwork: false"),
    ({"network": {"multusNetworks": "own, kube-system/macvlan@net1"}}, "spec.network.multusNetworks", 'networks "kube-system/macvlan@net1" are not allowed'),
    ({"network": {"multusNetworks": '[{"name": "n", "namespace": "x"}]'}}, "spec.network.multusNetworks", 'the JSON form needs "*"'),
    # Loader variables, whatever the value.
    ({"extraEnv": [{"name": "LD_PRELOAD", "value": "/cm/x.so"}]}, "spec.extraEnv", 'env "LD_PRELOAD" make the loader'),
    ({"extraEnv": [{"name": "PYTHONPATH", "value": "/cm"}, {"name": "LD_LIBRARY_PATH", "value": "/cm"}]}, "spec.extraEnv", 'env "PYTHONPATH", "LD_LIBRARY_PATH"'),
    ({"extraEnv": [{"name": "PYTHONSTARTUP", "value": "/cm/x.py"}]}, "spec.extraEnv", "policy.loaderEnv: false"),
    ({"extraEnv": [{"name": "NCCL_NET_PLUGIN", "value": "/cm/x.so"}]}, "spec.extraEnv", "policy.loaderEnv"),
    # Mounts that reach the output volume or /output.
    ({"extraVolumeMounts": [{"name": "output", "mountPath": "/mnt/other", "subPath": "victim"}]}, "spec.extraVolumeMounts", 'volume mounts at "/mnt/other" reach the output volume'),
    ({"extraVolumeMounts": [{"name": "cache", "mountPath": "/output/victim"}]}, "spec.extraVolumeMounts", 'volume mounts at "/output/victim" are not allowed'),
    ({"extraVolumeMounts": [{"name": "cache", "mountPath": "//output"}]}, "spec.extraVolumeMounts", '"//output"'),
    ({"extraVolumeMounts": [{"name": "cache", "mountPath": "/x/../output"}]}, "spec.extraVolumeMounts", '"/x/../output"'),
    ({"output": {"claimName": "shared"}, "extraVolumes": [{"name": "again", "persistentVolumeClaim": {"claimName": "shared"}}]}, "spec.extraVolumes", 'volumes "again" mount the output PVC "shared" again'),
    # Mounts only under policy.mountPrefixes, normalized, off the image's and the chart's paths:
    # a ConfigMap item over tini, a .pth in the venv, a pickle in iopath's cache of the weights.
    ({"extraVolumeMounts": [{"name": "cm", "mountPath": "/usr/bin/tini", "subPath": "tini"}]}, "spec.extraVolumeMounts", 'volume mounts at "/usr/bin/tini"'),
    ({"extraVolumeMounts": [{"name": "cm", "mountPath": "/opt/venv/lib/python3.11/site-packages/x.pth", "subPath": "x.pth"}]}, "spec.extraVolumeMounts", 'policy.mountPrefixes ("/mnt/")'),
    ({"extraVolumeMounts": [{"name": "cm", "mountPath": "/home/megdet/.torch/iopath_cache/detectron2/ImageNetPretrained/MSRA/R-50.pkl", "subPath": "p"}]}, "spec.extraVolumeMounts", "policy.privileged.anyMountPath"),
    ({"extraVolumeMounts": [{"name": "cm", "mountPath": "/mnt/../usr/bin/tini"}]}, "spec.extraVolumeMounts", '"/mnt/../usr/bin/tini"'),
    ({"extraVolumeMounts": [{"name": "cm", "mountPath": "/mnt"}]}, "spec.extraVolumeMounts", 'volume mounts at "/mnt"'),
    ({"extraVolumeMounts": [{"name": "cm", "mountPath": "/mnt//x"}, {"name": "cm", "mountPath": "/mnt/x/"}, {"name": "cm", "mountPath": "/mnt/./x"}, {"name": "cm", "mountPath": "mnt/x"}]}, "spec.extraVolumeMounts", '"/mnt//x", "/mnt/x/", "/mnt/./x", "mnt/x"'),
    # Environment variables by pattern, with what the pods' software reads reserved.
    ({"extraEnv": [{"name": "PATH", "value": "/cm:/usr/bin"}]}, "spec.extraEnv", 'env "PATH" are not allowed'),
    ({"extraEnv": [{"name": "FVCORE_CACHE", "value": "/mnt/cm"}, {"name": "IOPATH_CACHE", "value": "/mnt/cm"}]}, "spec.extraEnv", '"FVCORE_CACHE", "IOPATH_CACHE"'),
    ({"extraEnv": [{"name": "TORCH_HOME"}, {"name": "PYTORCH_CUDA_ALLOC_CONF"}, {"name": "PET_NPROC_PER_NODE"}, {"name": "MEGDET_RUN_UID"}, {"name": "DETECTRON2_ENV_MODULE"}]}, "spec.extraEnv", '"TORCH_HOME", "PYTORCH_CUDA_ALLOC_CONF", "PET_NPROC_PER_NODE", "MEGDET_RUN_UID", "DETECTRON2_ENV_MODULE"'),
    ({"extraEnv": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]}, "spec.extraEnv", "NCCL is set through spec.nccl"),
    ({"extraEnv": [{"name": "RANK"}, {"name": "WORLD_SIZE"}, {"name": "MASTER_ADDR"}, {"name": "LOCAL_RANK"}]}, "spec.extraEnv", '"RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK"'),
    ({"extraEnv": [{"name": "lower_case"}, {"name": "A-B"}]}, "spec.extraEnv", 'policy.envNames ("^[A-Z][A-Z0-9_]*$")'),
    # Labels and annotations under the allowed prefixes; the platform's megdet.io/ never.
    ({"podLabels": {"app": "database", "user.megdet.io/team": "vision"}}, "spec.podLabels", 'pod labels "app" are not allowed by the cluster\'s MegDet policy (policy.labelPrefixes: "user.megdet.io/"'),
    ({"podLabels": {"megdet.io/progress-endpoint": "active"}}, "spec.podLabels", "never under megdet.io/"),
    ({"podAnnotations": {"sidecar.istio.io/inject": "false"}}, "spec.podAnnotations", 'pod annotations "sidecar.istio.io/inject" are not allowed'),
    ({"podAnnotations": {"user.megdet.io/a": "b", "kubernetes.io/egress-bandwidth": "1M"}}, "spec.podAnnotations", "policy.annotationPrefixes"),
    # Group id 0, as the user id 0: the podSecurity knob.
    ({"podSecurityContext": {"runAsUser": 10001, "runAsGroup": 0}}, "spec.podSecurityContext", "group id 0"),
    ({"podSecurityContext": {"runAsUser": 10001, "fsGroup": 0}}, "spec.podSecurityContext", "any id but 0"),
    ({"podSecurityContext": {"runAsUser": 10001, "supplementalGroups": [10001, 0]}}, "spec.podSecurityContext", "policy.privileged.podSecurity: false"),
    # Device-plugin resources.
    ({"gpuResource": "squat.ai/kvm"}, "spec.gpuResource", 'GPU resource "squat.ai/kvm" is not allowed'),
    ({"nccl": {"ib": {"enabled": True, "rdmaResourceName": "smarter-devices/fuse"}}}, "spec.nccl.ib.rdmaResourceName", "policy.rdmaResources"),
    # Reserved nodes.
    ({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}, "spec.nodeSelector", 'node labels "node-role.kubernetes.io/control-plane" select nodes'),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "node-role.kubernetes.io/master", "operator": "Exists"}]}]}}}}, "spec.affinity", "policy.reservedNodeLabels"),
    ({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "In", "values": ["x"]}]}}]}}}, "spec.affinity", "node affinity selects nodes"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "field", "words"), REFUSED)
def test_each_rule_names_its_field_and_the_allowed_values(
    change: dict[str, Any], field: str, words: str
) -> None:
    found = problems({**SECURE, **change})
    assert list(found) == [field]
    assert words in found[field] and "the cluster's MegDet policy" in found[field]


def test_what_the_new_knobs_let_through_by_default_and_when_opened() -> None:
    """The safe side of each gap the policy closes passes the default policy; each value opens
    its gap, and only that one."""
    fine = {
        **SECURE,
        "podAnnotations": {
            "container.apparmor.security.beta.kubernetes.io/pytorch": "localhost/train",
            "seccomp.security.alpha.kubernetes.io/pod": "runtime/default",
            "user.megdet.io/team": "vision",
        },
        "podLabels": {"user.megdet.io/team": "vision"},
        "network": {"multusNetworks": "rdma-net, rdma-net2@net2"},
        "extraEnv": [{"name": "MY_FLAG", "value": "1"}, {"name": "DATA_ROOT"}],
        "extraVolumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "cache"}}],
        "extraVolumeMounts": [
            {"name": "cache", "mountPath": "/mnt/cache", "subPath": "mine"},
            {"name": "cache", "mountPath": "/mnt/outputs-old/x.py", "subPath": "x.py"},
        ],
        "output": {"claimName": "out"},
        "gpuResource": "nvidia.com/gpu",
        "nccl": {"ib": {"enabled": False, "rdmaResourceName": "anything/else"}},
        "nodeSelector": {"nvidia.com/gpu.product": "H100", "node-role.kubernetes.io/worker": ""},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"},
                                {"key": "node-role.kubernetes.io/master", "operator": "NotIn", "values": [""]},
                            ]
                        }
                    ]
                }
            }
        },
    }  # fmt: skip
    assert problems(fine) == {}
    opened = {
        "multusNamespaces": (["*"], {"network": {"multusNetworks": '[{"name": "n"}]'}}),
        "multusDefaultNetwork": (True, {"podAnnotations": {"v1.multus-cni.io/default-network": "n"}}),
        "loaderEnv": (True, {"extraEnv": [{"name": "LD_PRELOAD", "value": "/x.so"}]}),
        "outputMounts": (True, {"extraVolumeMounts": [{"name": "output", "mountPath": "/mnt/o", "subPath": "v"}]}),
        "mountPrefixes": (["/mnt/", "/scratch/"], {"extraVolumeMounts": [{"name": "c", "mountPath": "/scratch/a"}]}),
        "envNames": (["^[A-Z][A-Z0-9_]*$", "^team_[a-z]+$"], {"extraEnv": [{"name": "team_flag"}]}),
        "labelPrefixes": (["*"], {"podLabels": {"team": "vision"}}),
        "annotationPrefixes": (["user.megdet.io/", "sidecar.istio.io/"], {"podAnnotations": {"sidecar.istio.io/inject": "false"}}),
        "gpuResources": (["nvidia.com/gpu", "amd.com/gpu"], {"gpuResource": "amd.com/gpu"}),
        "rdmaResources": (["*"], {"nccl": {"ib": {"enabled": True, "rdmaResourceName": "x/y"}}}),
        "reservedNodeLabels": ([], {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}),
    }  # fmt: skip
    for key, (value, change) in opened.items():
        spec = {**SECURE, **change}
        assert problems(spec), key
        assert problems(spec, Policy.from_values({key: value})) == {}, key
    # key=value entries reserve only that value; other namespaces can be listed by name.
    dedicated = Policy.from_values({"reservedNodeLabels": ["dedicated=infra"]})
    assert problems({**SECURE, "nodeSelector": {"dedicated": "training"}}, dedicated) == {}
    assert "spec.nodeSelector" in problems(
        {**SECURE, "nodeSelector": {"dedicated": "infra"}}, dedicated
    )
    shared = Policy.from_values({"multusNamespaces": ["", "net-shared"]})
    assert problems({**SECURE, "network": {"multusNetworks": "net-shared/ib, own"}}, shared) == {}
    # The AppArmor annotation is the podSecurity knob, with the grant like podSecurityContext.
    unconfined = {"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}
    assert problems({**SECURE, "podAnnotations": unconfined}) == {
        "spec.podAnnotations": "an AppArmor or seccomp annotation that does not confine the pods "
        "(unconfined; confined are runtime/default and localhost/<profile>) is not allowed by "
        "the cluster's MegDet policy (policy.privileged.podSecurity: false)"
    }


def test_queues_when_the_policy_names_them_or_requires_one() -> None:
    listed = Policy(queues=("team-a", "team-b"))
    assert problems(SECURE, listed) == {}
    assert (
        "policy.queues"
        in problems({**SECURE, "kueue": {"queueName": "x"}}, listed)["spec.kueue.queueName"]
    )
    required = Policy(requireQueue=True)
    assert problems(SECURE, required) == {}
    assert problems({**SECURE, "kueue": {"queueName": ""}}, required) == {
        "spec.kueue.queueName": "the cluster's MegDet policy requires a Kueue LocalQueue "
        "(policy.requireQueue)"
    }


def test_wildcards_and_a_policy_that_allows_the_privileged_knobs() -> None:
    spec = {
        **SECURE,
        "image": {"repository": "docker.io/x"},
        "serviceAccountName": "trainer",
        "tolerations": [{"operator": "Exists"}],
        "network": {"hostNetwork": True},
        "extraVolumes": [{"name": "h", "hostPath": {"path": "/dev/infiniband"}}],
    }
    assert set(problems(spec)) == {
        "spec.image.repository",
        "spec.serviceAccountName",
        "spec.tolerations",
        "spec.network.hostNetwork",
        "spec.extraVolumes",
    }
    open_policy = Policy.from_values(
        {
            "imageRepositories": ["*"],
            "serviceAccounts": ["*"],
            "tolerationKeys": ["*"],
            "privileged": {"hostNetwork": True, "hostPath": True},
        }
    )
    assert problems(spec, open_policy) == {}
    # The two knobs the spec uses, each refused by its own policy.privileged key.
    assert "policy.privileged.hostNetwork: false" in problems(spec)["spec.network.hostNetwork"]
    assert "policy.privileged.hostPath: false" in problems(spec)["spec.extraVolumes"]


def mounts(*paths: str) -> dict[str, Any]:
    return {**SECURE, "extraVolumeMounts": [{"name": "cache", "mountPath": p} for p in paths]}


def test_mounts_stay_under_the_allowed_folders_and_off_the_images_and_the_charts_paths() -> None:
    assert problems(mounts("/mnt/a", "/mnt/a/b.py", "/mnt/data-2", "/mnt/x..y")) == {}
    # The anyMountPath knob lets anything through (with the grant, at admission).
    anywhere = Policy.from_values({"privileged": {"anyMountPath": True}})
    assert problems(mounts("/usr/bin/tini", "/output", "/mnt//x"), anywhere) == {}
    # A platform that opens every folder still keeps mounts off what the pods use: at, above,
    # under or beside (same folder) each of the image's and the chart's paths.
    everywhere = Policy.from_values({"mountPrefixes": ["/"]})
    assert problems(mounts("/scratch", "/scratch/a", "/models/x", "/srv"), everywhere) == {}
    for path in (
        "/data",
        "/data/coco",
        "/output/other-run",
        "/dev/shm/x",
        "/dev/x",
        "/var/run/secrets/megdet.io/progress/token",
        "/var/run/secrets/megdet.io/other",
        "/var/run",
        "/opt/venv/lib/python3.11/site-packages/evil.pth",
        "/opt/other",
        "/opt",
        "/home/megdet/.torch/iopath_cache/x.pkl",
        "/home/other",
        "/usr/bin/tini",
        "/tmp/megdet-metrics",
        "/etc/ld.so.preload",
        "/",
    ):
        found = problems(mounts(path), everywhere)
        assert list(found) == ["spec.extraVolumeMounts"], path
        assert f'"{path}"' in found["spec.extraVolumeMounts"], path
    # Without the output volume (outputMounts), mounted again, at a fine path.
    again = {**SECURE, "extraVolumeMounts": [{"name": "output", "mountPath": "/mnt/o"}]}
    assert "policy.outputMounts: false" in problems(again)["spec.extraVolumeMounts"]


def test_the_reserved_mounts_hold_every_path_the_run_chart_mounts() -> None:
    from megdet.controller.render import render_run
    from megdet.policy.reserved import RESERVED_MOUNTS

    progress = {"url": "https://p.megdet-system.svc:8443", "caConfigMap": "ca", "runUID": "u"}
    for target in ("pytorchjob", "trainjob"):
        spec = {"gpus": 16, "gpusPerNode": 8, "target": target, "progress": progress}
        rendered = render_run("r", "ns", spec)
        paths = {
            m["mountPath"]
            for obj in rendered.objects
            for c in _containers(obj)
            for m in c.get("volumeMounts") or []
        }
        assert paths, target
        assert paths <= set(RESERVED_MOUNTS), paths - set(RESERVED_MOUNTS)
        # Nothing the chart mounts lies under the default mount folders.
        assert not [p for p in paths for m in Policy().mountPrefixes if p.startswith(m)]


def _containers(obj: Any) -> list[dict[str, Any]]:
    """Every container (init ones too) anywhere in a rendered object."""
    if isinstance(obj, dict):
        found = [c for key in ("containers", "initContainers") for c in obj.get(key) or []]
        return found + [c for v in obj.values() for c in _containers(v)]
    if isinstance(obj, list):
        return [c for v in obj for c in _containers(v)]
    return []


def test_env_names_by_pattern_with_the_reserved_ones_never_and_the_loaders_behind_loaderenv() -> (
    None
):
    loader = Policy.from_values({"loaderEnv": True})
    env = {**SECURE, "extraEnv": [{"name": "LD_PRELOAD"}, {"name": "PYTHONPATH"}, {"name": "HOME"}]}
    assert problems(env, loader) == {}
    for name in ("PATH", "FVCORE_CACHE", "TORCH_HOME", "NCCL_SOCKET_IFNAME", "RANK"):
        found = problems({**SECURE, "extraEnv": [{"name": name}]}, loader)
        assert f'env "{name}" are not allowed' in found["spec.extraEnv"], name
    # A pattern the platform adds; reserved names stay refused whatever the patterns allow.
    anything = Policy.from_values({"envNames": [".*"]})
    assert problems({**SECURE, "extraEnv": [{"name": "my.var-1"}]}, anything) == {}
    assert "spec.extraEnv" in problems({**SECURE, "extraEnv": [{"name": "PATH"}]}, anything)


def test_label_and_annotation_prefixes_and_the_platforms_keys() -> None:
    anything = Policy.from_values({"labelPrefixes": ["*"], "annotationPrefixes": ["*"]})
    free = {"team": "vision", "example.com/x": "y"}
    assert problems({**SECURE, "podLabels": free, "podAnnotations": free}, anything) == {}
    platform = {"megdet.io/progress-endpoint": "active"}
    found = problems({**SECURE, "podLabels": platform, "podAnnotations": platform}, anything)
    assert set(found) == {"spec.podLabels", "spec.podAnnotations"}
    # The annotations other values govern are not the prefixes' to refuse.
    governed = {
        "container.apparmor.security.beta.kubernetes.io/pytorch": "runtime/default",
        "v1.multus-cni.io/default-network": "n",
    }
    assert list(problems({**SECURE, "podAnnotations": governed})) == ["spec.podAnnotations"]
    assert (
        problems(
            {**SECURE, "podAnnotations": governed},
            Policy.from_values({"multusDefaultNetwork": True}),
        )
        == {}
    )


def test_group_id_zero_is_the_podsecurity_knob_and_other_ids_are_free() -> None:
    ids = {"runAsUser": 10001, "runAsGroup": 5, "fsGroup": 10001, "supplementalGroups": [1, 2]}
    assert problems({**SECURE, "podSecurityContext": ids}) == {}
    root_group = {**SECURE, "podSecurityContext": {**ids, "fsGroup": 0}}
    assert problems(root_group) == {
        "spec.podSecurityContext": "group id 0 (spec.podSecurityContext runAsGroup, fsGroup or "
        "supplementalGroups: any id but 0) is not allowed by the cluster's MegDet policy "
        "(policy.privileged.podSecurity: false)"
    }
    allowed = Policy.from_values({"privileged": {"podSecurity": True}})
    assert problems(root_group, allowed) == {}
    # The CRD's default podSecurityContext passes.
    from megdet.api.validation import default_spec

    assert problems(default_spec({"gpus": 8})) == {}


def test_any_spec_gives_problems_not_exceptions() -> None:
    """A spec whose fields are mistyped is the schema's to refuse: every rule that cannot be
    evaluated on it is no policy problem, and nothing raises."""
    mistyped = [
        None,
        [],
        "x",
        {"image": "x", "extraVolumes": "y", "tolerations": [1, None]},
        {"image": {"repository": 5}, "serviceAccountName": ["a"], "gpuResource": {}},
        {"extraEnv": [{"name": 1}], "extraVolumeMounts": [{"mountPath": [7]}], "nodeSelector": [1]},
        {"podSecurityContext": {"runAsUser": "0", "sysctls": 5}, "podAnnotations": [1]},
        {"network": {"multusNetworks": 3, "hostNetwork": "true"}, "nccl": {"ib": []}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": 1}}},
    ]
    for spec in mistyped:
        assert check(spec, Policy()) == [], spec
    assert check({"podSecurityContext": None, "extraEnv": None}, Policy()) == []


# cel-python has no Kubernetes strings library: the three functions the rules call, for it.
_CELPY_FUNCTIONS = {
    "split": lambda s, sep: celtypes.ListType([celtypes.StringType(x) for x in s.split(sep)]),
    "join": lambda items, sep: celtypes.StringType(sep.join(items)),
    "trim": lambda s: celtypes.StringType(s.strip()),
}


def _celpy(rule: Any, spec: dict[str, Any], policy: Policy) -> str | None:
    """``rule``'s message for ``spec`` as cel-python computes it, or None when it passes."""
    env = celpy.Environment()
    bound = {
        "s": celpy.json_to_cel(spec),
        "variables": celpy.json_to_cel(policy.values()),
    }

    def run(text: str) -> Any:
        return env.program(env.compile(text), functions=_CELPY_FUNCTIONS).evaluate(bound)

    try:
        passed = run(rule.expression)
        if not isinstance(passed, celtypes.BoolType) or bool(passed):
            return None
        message = run(rule.message)
    except celpy.CELEvalError:
        return None
    return str(message) if isinstance(message, str) else None


def test_the_controllers_cel_and_cel_python_give_each_rule_the_same_verdict_and_words() -> None:
    """The controller evaluates the rules' CEL with the Rust interpreter; cel-python, an
    independent implementation, reads the same text the same way: the verdict and the message
    of every rule, on every refused case above and on specs each policy lets through."""
    specs = [SECURE, {}] + [{**SECURE, **change} for change, _, _ in REFUSED]
    policies = [Policy(), Policy.from_values({"imageRepositories": ["*"], "loaderEnv": True})]
    fired = set()
    for policy in policies:
        for spec in specs:
            for rule in policy_module.RULES:
                ours = rule.check(spec, policy)
                assert ours == _celpy(rule, spec, policy), (rule.name, spec)
                if ours:
                    fired.add(rule.name)
    assert fired >= {rule.name for rule in policy_module.RULES} - {"queues", "requireQueue"}


# ------------------------------------------------------------------------------------------
# The controller: outside the policy, nothing is created.


async def test_the_controller_refuses_a_run_outside_the_policy_before_creating_its_job(
    cluster,
) -> None:
    denied_before = metrics.sample("megdet_controller_reconciles_total", {"result": "denied"})
    op = await start_operator(str(cluster.url))
    try:
        await apply(cluster, run_body("r", {"gpus": 8, "network": {"hostNetwork": True}}))

        def valid_condition() -> dict[str, Any] | None:
            status = (get(cluster, RUNS, "r") or {}).get("status") or {}
            return next((c for c in status.get("conditions") or [] if c["type"] == "Valid"), None)

        cond = await eventually(valid_condition, message="Valid condition")
        assert cond["status"] == "False" and cond["reason"] == "PolicyDenied"
        assert "spec.network.hostNetwork: host networking" in cond["message"]
        assert get(cluster, RUNS, "r")["status"]["phase"] == "Invalid"
        await eventually(
            lambda: [e for e in events_for(cluster, "r") if e.get("reason") == "PolicyDenied"],
            message="a PolicyDenied Warning event",
        )
        assert not requests_to(cluster, "POST", "/pytorchjobs")
        assert get(cluster, PYTORCHJOBS, "r") is None
        assert (
            metrics.sample("megdet_controller_reconciles_total", {"result": "denied"})
            >= denied_before + 1
        )
        # The spec brought inside the policy: the job is created.
        await edit(cluster, "r", 2, {"network": {"hostNetwork": False}})
        await eventually(lambda: get(cluster, PYTORCHJOBS, "r"), message="the job")
    finally:
        await stop_operator(op)


async def test_a_controller_whose_policy_allows_a_knob_creates_the_job(cluster) -> None:
    allowing = Policy.from_values({"privileged": {"hostNetwork": True}})
    op = await start_operator(str(cluster.url), policy=allowing)
    try:
        await apply(cluster, run_body("h", {"gpus": 8, "network": {"hostNetwork": True}}))
        job = await eventually(lambda: get(cluster, PYTORCHJOBS, "h"), message="the job")
        pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        assert pod["hostNetwork"] is True
    finally:
        await stop_operator(op)


def test_unsafe_weights_are_the_operators_decision_for_every_run() -> None:
    from megdet.controller.planning import Planned, plan_children

    run = run_body("w", {"gpus": 8, "extraOverrides": {"MODEL.WEIGHTS": "/data/init.pkl"}})

    def trainer_args(unsafe: bool) -> list[str]:
        decision = plan_children(run, unsafe_weights=unsafe)
        assert isinstance(decision, Planned), decision
        pod = decision.job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        return pod["containers"][0]["args"]

    assert "MEGDET.ALLOW_UNSAFE_WEIGHTS" not in trainer_args(False)
    args = trainer_args(True)
    assert args[args.index("MEGDET.ALLOW_UNSAFE_WEIGHTS") + 1] == "True"
    # A run cannot ask for it itself: not a MegDetRun field.
    own = plan_children(run_body("w", {"gpus": 8, "allowUnsafeWeights": True}))
    assert not isinstance(own, Planned)
    assert [str(p) for p in own.problems] == [
        "spec.allowUnsafeWeights: unknown field: set by the operator, not a MegDetRun field"
    ]
    assert Policy.from_values({"unsafeWeights": True}).unsafeWeights is True


@pytest.mark.parametrize("key", DROPPED_VALUES)
def test_a_run_carrying_an_operator_value_is_refused_not_rendered(key) -> None:
    """The API server prunes these (the CRD has no such field); a CRD installed without its
    schema still must not let a run's author set them (e.g. a privileged container)."""
    from megdet.controller.planning import Invalid, plan_children

    value = {"privileged": True} if key == "containerSecurityContext" else {"x": "y"}
    decision = plan_children(run_body("o", {"gpus": 8, key: value}))
    assert isinstance(decision, Invalid)
    assert [p.path for p in decision.problems] == [f"spec.{key}"]


async def test_a_stricter_policy_applies_at_the_next_spec_change_and_suspend_goes_through(
    cluster,
) -> None:
    """A run made under a looser policy keeps its job; its owner can still
    suspend and resume it; any other spec change is checked against the policy as it is now
    (Valid=False, PolicyDenied, the phase and the job kept, the change not applied)."""
    allowing = Policy.from_values({"privileged": {"hostNetwork": True}})
    op = await start_operator(str(cluster.url), policy=allowing)
    try:
        await apply(cluster, run_body("old", {"gpus": 8, "network": {"hostNetwork": True}}))
        await eventually(lambda: get(cluster, PYTORCHJOBS, "old"), message="the job")
        await eventually(lambda: phase(cluster, "old") not in (None, "Invalid"), message="phase")
    finally:
        await stop_operator(op)
    # The platform tightens the policy: the controller restarts with the defaults.
    op = await start_operator(str(cluster.url))
    try:
        await reconciled(cluster, "old")
        assert condition(cluster, "old", "Valid")["status"] == "True"  # untouched: it stands
        before = phase(cluster, "old")

        def suspended() -> bool | None:
            return get(cluster, PYTORCHJOBS, "old")["spec"]["runPolicy"].get("suspend")

        # Metadata is no spec change (kopf's diff has it too): not checked.
        before_reconciles = reconciles()
        await patch(cluster, RUNS, "old", {"metadata": {"labels": {"team": "vision"}}})
        await counted(before_reconciles)
        assert condition(cluster, "old", "Valid")["status"] == "True"
        await edit(cluster, "old", 2, {"runPolicy": {"suspend": True}})
        await eventually(lambda: suspended() is True, message="the job suspended")
        assert condition(cluster, "old", "Valid")["status"] == "True"
        # Another spec change: checked against the policy as it is now.
        await edit(cluster, "old", 3, {"podLabels": {"user.megdet.io/team": "vision"}})

        def denied() -> dict[str, Any] | None:
            valid = condition(cluster, "old", "Valid") or {}
            return valid if valid.get("reason") == "PolicyDenied" else None

        valid = await eventually(denied, message="Valid=False, PolicyDenied")
        assert valid["status"] == "False" and valid["observedGeneration"] == 3
        assert "spec.network.hostNetwork: host networking" in valid["message"]
        assert phase(cluster, "old") == before  # the job runs on, its phase mirrored as before
        assert get(cluster, PYTORCHJOBS, "old") is not None
        await eventually(
            lambda: [e for e in events_for(cluster, "old") if e.get("reason") == "PolicyDenied"],
            message="a PolicyDenied Warning event",
        )
        # Resuming still goes through, and the run stays denied.
        await edit(cluster, "old", 4, {"runPolicy": {"suspend": False}})
        await eventually(lambda: suspended() is False, message="the job resumed")
        assert (denied() or {}).get("status") == "False"
        # Brought inside the policy: valid again.
        await edit(cluster, "old", 5, {"network": {"hostNetwork": False}})
        await eventually(
            lambda: (condition(cluster, "old", "Valid") or {}).get("status") == "True",
            message="Valid=True again",
        )
    finally:
        await stop_operator(op)
