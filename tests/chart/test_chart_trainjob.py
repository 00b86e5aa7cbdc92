"""target=trainjob: the Kubeflow Trainer v2 TrainJob and its per-run TrainingRuntime.

The pod must be the PyTorchJob path's pod apart from what the two operators dictate; the
objects must pass a schema written from Trainer v2.3.0's API types and the rules its webhooks
and plugins apply (kubeflow/trainer v2.3.0: pkg/webhooks/trainingruntime_webhook.go,
pkg/runtime/framework/plugins/torch/torch.go; kubernetes-sigs/jobset v0.12.0:
pkg/webhooks/jobset_webhook.go). docs/trainer-v2.md has the mapping these tests pin.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_helpers import (
    ALL_CI_VALUES,
    CHART_DIR,
    NAMESPACE,
    RELEASE,
    SCHEMAS,
    TRAINJOB_CI_VALUES,
    diff_paths,
    values_file,
    values_from,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megdet.plan import plan_run

K8S_VERSIONS = ("1.27.0", "1.34.0")
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
# Trainer v2.3.0 pkg/constants/constants.go TorchRunReservedEnvNames: the torch plugin owns them.
PET_ENV = {
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
}

# The only differences allowed between a PyTorchJob replica's pod template and the TrainJob's
# pod template, each dictated by one of the operators (path in the template -> why).
INJECTED = {
    ("spec", "containers", 0, "name"): (
        "kubeflow.org/v1's webhook requires a container named `pytorch`; Trainer v2's "
        "TrainingRuntime webhook requires `node` for the trainer step, and its torch plugin "
        "injects PET_* only into `node`"
    ),
    ("metadata", "labels", "app.kubernetes.io/component"): (
        "v1 has Master and Worker replicas (master|worker); Trainer v2 runs every node from "
        "one replicated job named `node`"
    ),
    ("spec", "restartPolicy"): (
        "the v1 operator sets the pod's restartPolicy from the replica's; a JobSet's Job pod "
        "template must carry it: Never, so JobSet's failurePolicy restarts the whole gang"
    ),
}

RDMA = "rdma/rdma_shared_device_a"


def trainjob_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The same values with target=trainjob."""
    return {**copy.deepcopy(dict(values)), "target": "trainjob"}


def pytorchjob_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The same values with target=pytorchjob."""
    return {**copy.deepcopy(dict(values)), "target": "pytorchjob"}


def objects_of(render, values: Mapping[str, Any]) -> dict[str, list[dict]]:
    """Rendered objects grouped by kind."""
    out: dict[str, list[dict]] = {}
    for obj in render(values).objects:
        out.setdefault(obj["kind"], []).append(obj)
    return out


def trainer_run(render, values: Mapping[str, Any]) -> tuple[dict, dict, dict]:
    """The TrainJob, its TrainingRuntime and the merged values, for target=trainjob."""
    rendered = render(trainjob_values(values))
    kinds: dict[str, list[dict]] = {}
    for obj in rendered.objects:
        kinds.setdefault(obj["kind"], []).append(obj)
    assert "PyTorchJob" not in kinds
    (trainjob,) = kinds["TrainJob"]
    (runtime,) = kinds["TrainingRuntime"]
    return trainjob, runtime, rendered.values


def trainer_pair(render, values: Mapping[str, Any]) -> tuple[dict, dict]:
    """The one TrainJob and the one TrainingRuntime for values with target=trainjob."""
    trainjob, runtime, _ = trainer_run(render, values)
    return trainjob, runtime


def node_job(runtime: dict) -> dict:
    """The runtime's replicated job for the trainer step."""
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    trainers = [j for j in jobs if j["template"]["metadata"]["labels"].get(ANCESTOR) == "trainer"]
    assert len(trainers) == 1, jobs
    return trainers[0]


def node_pod_template(runtime: dict) -> dict:
    return node_job(runtime)["template"]["spec"]["template"]


# gpus x InfiniBand x gang; restartPolicy alternates with InfiniBand (its own tests cover it).
MATRIX = list(
    itertools.product(
        [1, 16, 64],  # gpus
        [False, True],  # InfiniBand
        ["off", "volcano", "scheduler-plugins"],  # gang
    )
)


def matrix_values(gpus: int, ib: bool, gang: str) -> dict:
    sets = [f"gpus={gpus}", f"restartPolicy={'ExitCode' if ib else 'OnFailure'}"]
    if ib:
        sets += ["nccl.ib.enabled=true", f"nccl.ib.rdmaResourceName={RDMA}", "nccl.ib.hca=mlx5"]
    if gang == "volcano":
        sets += ["gang.enabled=true", "gang.schedulerName=volcano", "gang.queue=research"]
    elif gang == "scheduler-plugins":
        sets += [
            "gang.enabled=true",
            "gang.schedulerName=scheduler-plugins-scheduler",
            "gang.scheduleTimeoutSeconds=300",
        ]
    return values_from(sets=sets)


CASES = {
    "defaults": {},
    **{p.name: values_file(p) for p in ALL_CI_VALUES},
    **{"matrix-{}-{}-{}".format(*m): matrix_values(*m) for m in MATRIX},
}


@pytest.fixture(scope="module")
def schemas() -> dict[str, jsonschema.Draft202012Validator]:
    """Validators for the project's Trainer v2.3.0 schemas, by kind (checked once)."""
    out = {}
    for kind, name in [("TrainJob", "trainjob"), ("TrainingRuntime", "trainingruntime")]:
        schema = json.loads((SCHEMAS / f"{name}-v1alpha1.schema.json").read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        out[kind] = jsonschema.Draft202012Validator(schema)
    return out


# --- the switch --------------------------------------------------------------------------------


def test_default_target_renders_the_pytorchjob_and_no_trainer_objects(render):
    kinds = objects_of(render, {})
    assert len(kinds["PyTorchJob"]) == 1
    assert "TrainJob" not in kinds and "TrainingRuntime" not in kinds


def test_trainjob_target_renders_the_trainjob_first_then_its_runtime(render):
    objects = [
        o for o in render({"target": "trainjob"}).objects if o["apiVersion"].startswith("trainer.")
    ]
    assert [o["kind"] for o in objects] == ["TrainJob", "TrainingRuntime"]


@pytest.mark.parametrize("bad", ["TrainJob", "trainer", "v2", ""])
def test_schema_refuses_an_unknown_target_naming_the_values(render, bad):
    message = render.error({"target": bad})
    assert "at '/target'" in message
    assert "'pytorchjob', 'trainjob'" in message


# --- the same pod ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_pod_is_the_pytorchjob_pod_apart_from_operator_injected_parts(render, case):
    values = CASES[case]
    (v1,) = objects_of(render, pytorchjob_values(values))["PyTorchJob"]
    _, runtime = trainer_pair(render, values)
    node = node_pod_template(runtime)
    for role, replica in v1["spec"]["pytorchReplicaSpecs"].items():
        v1_pod = replica["template"]
        # Exactly the listed paths differ: nothing else of the pod may drift between targets.
        assert diff_paths(v1_pod, node) == set(INJECTED), role
        assert v1_pod["spec"]["containers"][0]["name"] == "pytorch"
        assert v1_pod["metadata"]["labels"]["app.kubernetes.io/component"] == role.lower()
        assert "restartPolicy" not in v1_pod["spec"]
    assert node["spec"]["containers"][0]["name"] == "node"
    assert node["metadata"]["labels"]["app.kubernetes.io/component"] == "node"
    assert node["spec"]["restartPolicy"] == "Never"


@st.composite
def run_values(draw) -> dict[str, Any]:
    """Values across the pod's optional parts: shape, network, IB, gang, placement, extras."""
    per_node = draw(st.sampled_from([1, 2, 4, 8]))
    values: dict[str, Any] = {
        "gpus": per_node * draw(st.integers(1, 12)),
        "gpusPerNode": per_node,
        "network": {"hostNetwork": draw(st.booleans())},
        "terminationGracePeriodSeconds": draw(st.integers(30, 3600)),
        "priorityClassName": draw(st.sampled_from(["", "high"])),
        "podLabels": draw(st.dictionaries(st.sampled_from(["team", "tier"]), st.just("x"))),
        "podAnnotations": draw(st.dictionaries(st.sampled_from(["a.io/x"]), st.just("y"))),
        "extraEnv": draw(st.sampled_from([[], [{"name": "OMP_NUM_THREADS", "value": "4"}]])),
        "restartPolicy": draw(st.sampled_from(["OnFailure", "Never", "ExitCode"])),
        "elastic": {
            "minGpus": 0,
            "maxGpus": 0,
            "resize": draw(st.sampled_from(["keep-batch", "rescale"])),
        },
    }
    if draw(st.booleans()):
        values["nccl"] = {"ib": {"enabled": True, "rdmaResourceName": RDMA}}
    if draw(st.booleans()):
        values["gang"] = {"enabled": True, "schedulerName": "volcano"}
    if draw(st.booleans()):
        values["extraVolumes"] = [{"name": "cfg", "configMap": {"name": "c"}}]
        values["extraVolumeMounts"] = [{"name": "cfg", "mountPath": "/cfg"}]
    return values


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=run_values())
def test_pod_equality_holds_across_generated_values(render, values):
    (v1,) = objects_of(render, pytorchjob_values(values))["PyTorchJob"]
    node = node_pod_template(trainer_pair(render, values)[1])
    for replica in v1["spec"]["pytorchReplicaSpecs"].values():
        assert diff_paths(replica["template"], node) == set(INJECTED)


def test_pod_comparison_notices_a_difference_outside_the_injected_parts(render):
    # Guards the comparison: one changed field in the TrainJob pod is reported.
    v1 = objects_of(render, {})["PyTorchJob"][0]["spec"]["pytorchReplicaSpecs"]["Master"]
    node = copy.deepcopy(node_pod_template(trainer_pair(render, {})[1]))
    node["spec"]["terminationGracePeriodSeconds"] += 1
    assert ("spec", "terminationGracePeriodSeconds") in diff_paths(v1["template"], node)


# --- Trainer's API and rules -------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_trainjob_and_runtime_pass_the_trainer_schema_and_operator_rules(render, schemas, case):
    values = CASES[case]
    trainjob, runtime, merged = trainer_run(render, values)
    for obj in (trainjob, runtime):
        schemas[obj["kind"]].validate(obj)
    plan = plan_run({k: merged[k] for k in ("gpus", "gpusPerNode", "imagesPerGpu")})
    spec, trainer = trainjob["spec"], trainjob["spec"]["trainer"]

    # The TrainJob references this run's runtime, in its own namespace.
    assert spec["runtimeRef"] == {
        "name": runtime["metadata"]["name"],
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
    }
    assert runtime["metadata"]["namespace"] == trainjob["metadata"]["namespace"]
    # Trainer's webhook refuses a TrainJob whose runtime does not exist yet; Helm installs
    # unknown kinds alphabetically (TrainJob first), so the runtime is a pre-install hook.
    assert runtime["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"

    # TrainingRuntime webhook: the trainer step's replicated job has replicas 1 and a `node`
    # container. The torch plugin's PET_MASTER_ADDR is <job>-node-0-0, so the job is `node`.
    job = node_job(runtime)
    assert job["name"] == "node" and job["replicas"] == 1
    pod = job["template"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]].count("node") == 1
    # Torch plugin: PET_* are injected only when spec.trainer is set; numNodes sets the node
    # count (PET_NNODES), numProcPerNode becomes PET_NPROC_PER_NODE.
    assert trainer["numNodes"] == plan.nodes == runtime["spec"]["mlPolicy"]["numNodes"]
    assert job["template"]["spec"]["parallelism"] == job["template"]["spec"]["completions"]
    assert job["template"]["spec"]["completions"] == plan.nodes
    assert trainer["numProcPerNode"] == plan.procs_per_node
    assert trainer["numNodes"] * trainer["numProcPerNode"] == plan.world_size
    (node,) = [c for c in pod["containers"] if c["name"] == "node"]
    gpu = merged["gpuResource"]
    assert node["resources"]["requests"][gpu] == node["resources"]["limits"][gpu]
    assert node["resources"]["limits"][gpu] == trainer["numProcPerNode"]
    assert "torch" in runtime["spec"]["mlPolicy"]
    # The torch plugin overwrites PET_*, and refuses them in spec.trainer.env.
    assert not PET_ENV & {e["name"] for e in node.get("env", [])}
    assert not PET_ENV & {e["name"] for e in trainer.get("env", [])}
    # Job pods may only be Never or OnFailure; a podFailurePolicy needs Never.
    assert pod["restartPolicy"] == "Never"
    # JobSet's webhook: <jobset>-<job>-<job index>-<pod index>-<5 random> within 63.
    name = trainjob["metadata"]["name"]
    assert len(f"{name}-node-0-{plan.nodes - 1}-abcde") <= 63


def as_job(runtime: dict) -> dict:
    """The runtime's trainer Job template as a batch/v1 Job, which kubernetes-validate knows."""
    job = node_job(runtime)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{runtime['metadata']['name']}-node-0",
            **job["template"]["metadata"],
        },
        "spec": job["template"]["spec"],
    }


@pytest.mark.parametrize("case", ["defaults", *(p.name for p in ALL_CI_VALUES)])
def test_runtime_job_and_pod_pass_kubernetes_validate_strict(render, case):
    _, runtime = trainer_pair(render, CASES[case])
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(as_job(runtime), version, strict=True)


def test_kubernetes_validate_strict_catches_a_typo_in_the_runtime_job(render):
    job = as_job(trainer_pair(render, {})[1])
    job["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSIONS[-1], strict=True)


# Fields that moved between Trainer releases, and JobSet rules the webhook enforces: the schema
# must refuse each (kind, path, value, message).
MISTAKES = [
    ("TrainJob", ("spec", "trainer", "numProcPerNode"), "auto", "is not of type 'integer'"),
    ("TrainJob", ("spec", "podTemplateOverrides"), [], "'podTemplateOverrides' was unexpected"),
    ("TrainJob", ("spec", "labels"), {"a": "b"}, "'labels' was unexpected"),
    ("TrainJob", ("metadata", "name"), "1run", "does not match"),
    ("TrainJob", ("spec", "runtimeRef", "kind"), "Runtime", "is not one of"),
    ("TrainingRuntime", ("spec", "mlPolicy", "torch", "numProcPerNode"), 8, "unexpected"),
    ("TrainingRuntime", ("spec", "mlPolicy", "mpi"), {}, "should not be valid"),
    (
        "TrainingRuntime",
        ("spec", "podGroupPolicy"),
        {"volcano": {}, "coscheduling": {}},
        "too many properties",
    ),
]


@pytest.mark.parametrize(("kind", "path", "value", "message"), MISTAKES)
def test_trainer_schema_refuses_fields_of_other_releases(
    render, schemas, kind, path, value, message
):
    trainjob, runtime = trainer_pair(render, {})
    obj = trainjob if kind == "TrainJob" else runtime
    node = obj
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError, match=re.escape(message)):
        schemas[kind].validate(obj)


def test_jobset_rule_names_follow_the_jobset_webhook_pattern(render, schemas):
    _, runtime = trainer_pair(render, {"restartPolicy": "ExitCode"})
    schemas["TrainingRuntime"].validate(runtime)
    runtime["spec"]["template"]["spec"]["failurePolicy"]["rules"][0]["name"] = "trainer-error"
    with pytest.raises(jsonschema.ValidationError, match="does not match"):
        schemas["TrainingRuntime"].validate(runtime)


# --- how each setting maps -----------------------------------------------------------------------


def failure_policy(runtime: dict) -> dict:
    return runtime["spec"]["template"]["spec"]["failurePolicy"]


@pytest.mark.parametrize(("policy", "max_restarts"), [("OnFailure", 5), ("Never", 0)])
def test_restart_policy_maps_to_whole_gang_restarts_up_to_backoff_limit(
    render, policy, max_restarts
):
    _, runtime = trainer_pair(render, {"restartPolicy": policy, "runPolicy": {"backoffLimit": 5}})
    assert failure_policy(runtime) == {"maxRestarts": max_restarts}
    job_spec = node_job(runtime)["template"]["spec"]
    assert job_spec["backoffLimit"] == 0  # a failed pod fails its Job; JobSet restarts the set
    assert "podFailurePolicy" not in job_spec


def test_exit_code_policy_fails_the_run_on_trainer_errors_and_restarts_on_signals(render):
    _, runtime = trainer_pair(
        render, {"restartPolicy": "ExitCode", "runPolicy": {"backoffLimit": 2}}
    )
    assert failure_policy(runtime) == {
        "maxRestarts": 2,
        "rules": [
            {
                "name": "TrainerExitCode",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
            }
        ],
    }
    (rule,) = node_job(runtime)["template"]["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"] == {
        "containerName": "node",
        "operator": "In",
        "values": list(range(1, 128)),
    }


def test_gang_with_volcano_uses_the_volcano_pod_group_and_queue_annotation(render):
    values = {
        "gpus": 16,
        "gang": {"enabled": True, "schedulerName": "volcano", "queue": "research"},
    }
    _, runtime = trainer_pair(render, values)
    assert runtime["spec"]["podGroupPolicy"] == {"volcano": {}}
    metadata = runtime["spec"]["template"]["metadata"]
    assert metadata["annotations"] == {"scheduling.volcano.sh/queue-name": "research"}
    assert node_pod_template(runtime)["spec"]["schedulerName"] == "volcano"


def test_gang_with_scheduler_plugins_uses_coscheduling_with_the_timeout(render):
    gang = {
        "enabled": True,
        "schedulerName": "scheduler-plugins-scheduler",
        "scheduleTimeoutSeconds": 120,
    }
    _, runtime = trainer_pair(render, {"gpus": 16, "gang": gang})
    assert runtime["spec"]["podGroupPolicy"] == {"coscheduling": {"scheduleTimeoutSeconds": 120}}
    assert "annotations" not in runtime["spec"]["template"]["metadata"]
    pod = node_pod_template(runtime)
    assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


def test_without_gang_there_is_no_pod_group_policy(render):
    _, runtime = trainer_pair(render, {"gpus": 16})
    assert "podGroupPolicy" not in runtime["spec"]
    assert "schedulerName" not in node_pod_template(runtime)["spec"]


def test_kueue_labels_the_trainjob_and_leaves_suspend_to_kueue(render):
    trainjob, _ = trainer_pair(render, {"kueue": {"queueName": "gpu-queue"}})
    assert trainjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    # Kueue creates the job suspended and resumes it on admission: `false` here would undo that.
    assert "suspend" not in trainjob["spec"]


@pytest.mark.parametrize("suspend", [True, False])
def test_suspend_is_rendered_without_kueue(render, suspend):
    trainjob, _ = trainer_pair(render, {"runPolicy": {"suspend": suspend}})
    assert trainjob["spec"]["suspend"] is suspend
    assert "kueue.x-k8s.io/queue-name" not in trainjob["metadata"]["labels"]


def test_deadline_goes_to_the_trainjob_and_ttl_to_the_jobset(render):
    run_policy = {"activeDeadlineSeconds": 7200, "ttlSecondsAfterFinished": 600}
    trainjob, runtime = trainer_pair(render, {"runPolicy": run_policy})
    assert trainjob["spec"]["activeDeadlineSeconds"] == 7200
    assert runtime["spec"]["template"]["spec"]["ttlSecondsAfterFinished"] == 600
    trainjob, runtime = trainer_pair(render, {})
    assert "activeDeadlineSeconds" not in trainjob["spec"]
    assert "ttlSecondsAfterFinished" not in runtime["spec"]["template"]["spec"]


def test_names_and_labels_follow_the_release(render):
    trainjob, runtime = trainer_pair(render, {})
    assert trainjob["metadata"]["name"] == runtime["metadata"]["name"] == RELEASE
    for obj in (trainjob, runtime):
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "megdet"
    labels = node_pod_template(runtime)["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == RELEASE
    assert labels["app.kubernetes.io/part-of"] == "megdet"


# --- names Trainer v2 refuses --------------------------------------------------------------------


@pytest.mark.parametrize("target", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("name", ["1run", "a.b"])
def test_a_name_that_is_not_an_rfc_1035_label_fails_for_both_targets(render, target, name):
    # The TrainJob CRD and the PyTorchJob webhook (NameIsDNS1035Label) both refuse it.
    message = render.error({"fullnameOverride": name, "target": target})
    assert f'the job name "{name}" must start with a letter' in message
    assert render({"fullnameOverride": "run-1", "target": target}).objects


@pytest.mark.parametrize(("gpus", "limit"), [(8, 48), (128, 47)])
def test_a_name_too_long_for_jobset_pod_names_fails_naming_the_limit(render, gpus, limit):
    ok = "r" * limit
    trainjob, _ = trainer_pair(render, {"gpus": gpus, "fullnameOverride": ok})
    assert trainjob["metadata"]["name"] == ok
    long = "r" * (limit + 1)
    message = render.error({"gpus": gpus, "fullnameOverride": long, "target": "trainjob"})
    assert f"is {limit + 1} characters" in message
    assert f"it can have at most {limit}" in message


# --- lint and NOTES ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["defaults", *(p.name for p in ALL_CI_VALUES)])
def test_lint_strict_passes_for_the_trainjob_target(case):
    values = trainjob_values(CASES[case])
    report = helm_python.lint(str(CHART_DIR), values, strict=True, namespace="vision")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_notes_tell_how_to_follow_a_trainjob(render):
    notes = render({"target": "trainjob", "gpus": 16}).notes
    assert "a TrainJob (Kubeflow Trainer v2)" in notes
    assert f"get trainjob {RELEASE} -w" in notes
    assert "pytorchjob" not in notes.lower()
    assert "2 (TrainJob numNodes), 8 GPUs each" in notes


def test_the_trainjob_ci_example_renders_a_trainjob_as_it_says(render):
    (path,) = [p for p in TRAINJOB_CI_VALUES if p.name == "trainjob-multinode-values.yaml"]
    kinds = objects_of(render, values_file(path))
    assert "PyTorchJob" not in kinds
    (trainjob,) = kinds["TrainJob"]
    (runtime,) = kinds["TrainingRuntime"]
    assert trainjob["spec"]["trainer"] == {"numNodes": 4, "numProcPerNode": 8}
    assert trainjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert "suspend" not in trainjob["spec"]
    assert trainjob["spec"]["activeDeadlineSeconds"] == 172800
    assert runtime["spec"]["podGroupPolicy"] == {"coscheduling": {"scheduleTimeoutSeconds": 600}}
    jobset = runtime["spec"]["template"]["spec"]
    assert jobset["failurePolicy"]["maxRestarts"] == 4
    assert jobset["ttlSecondsAfterFinished"] == 86400
    pod = node_pod_template(runtime)["spec"]
    (node,) = pod["containers"]
    assert node["resources"]["limits"]["rdma/rdma_shared_device_a"] == 1
    assert pod["schedulerName"] == "scheduler-plugins-scheduler"


# --- upgrades: what already exists -------------------------------------------------------------

LOOKUPS = {
    "trainjob": 'lookup "trainer.kubeflow.org/v1alpha1" "TrainJob" .Release.Namespace $name',
    "pytorchjob": 'lookup "kubeflow.org/v1" "PyTorchJob" .Release.Namespace $name',
}


@pytest.fixture(scope="module")
def chart_with_existing(tmp_path_factory) -> Path:
    """A chart copy whose upgrade lookups read files/existing-<kind>.yaml instead of a cluster.

    helm_python renders offline, where `lookup` returns nothing; each call is swapped for a
    file (the swap must find each call once: the wiring is part of the test).
    """
    chart = tmp_path_factory.mktemp("chart") / "megdet"
    shutil.copytree(CHART_DIR, chart)
    template = chart / "templates" / "trainjob.yaml"
    text = template.read_text()
    for key, call in LOOKUPS.items():
        assert text.count(call) == 1, f"trainjob.yaml does not have: {call}"
        text = text.replace(call, f'.Files.Get "files/existing-{key}.yaml" | fromYaml')
    template.write_text(text)
    return chart


def render_upgrade(chart: Path, existing: Mapping[str, dict], values: Mapping[str, Any]) -> dict:
    """Render an upgrade of `values` (target=trainjob) against the existing objects given."""
    for key in LOOKUPS:
        obj = existing.get(key)
        (chart / "files" / f"existing-{key}.yaml").write_text(yaml.safe_dump(obj) if obj else "")
    with helm_python.Chart.load(str(chart)) as loaded:
        return loaded.render(
            values=trainjob_values(values), name=RELEASE, namespace=NAMESPACE, is_upgrade=True
        )


def existing_trainjob(nodes: int, procs: int, deadline: int | None = None) -> dict:
    spec: dict[str, Any] = {"trainer": {"numNodes": nodes, "numProcPerNode": procs}}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    meta = {"name": RELEASE, "namespace": NAMESPACE}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": meta,
        "spec": spec,
    }


def test_upgrade_keeping_the_shape_renders(chart_with_existing):
    existing = {"trainjob": existing_trainjob(2, 8, 3600)}
    files = render_upgrade(
        chart_with_existing, existing, {"gpus": 16, "runPolicy": {"activeDeadlineSeconds": 3600}}
    )
    (trainjob, _) = [d for d in yaml.safe_load_all(files["megdet/templates/trainjob.yaml"]) if d]
    assert trainjob["spec"]["trainer"] == {"numNodes": 2, "numProcPerNode": 8}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"gpus": 32}, "runs 2 nodes x 8 processes and this upgrade asks for 4 x 8"),
        (
            {"gpus": 16, "gpusPerNode": 4},
            "gpus=16, gpusPerNode=4: the existing TrainJob vision/megdet",
        ),
    ],
)
def test_upgrade_that_changes_the_immutable_trainer_fails_naming_the_values(
    chart_with_existing, values, expected
):
    existing = {"trainjob": existing_trainjob(2, 8)}
    with pytest.raises(helm_python.HelmError) as err:
        render_upgrade(chart_with_existing, existing, values)
    assert expected in str(err.value)
    assert "spec.trainer cannot change on a TrainJob" in str(err.value)


def test_upgrade_that_changes_the_deadline_fails_naming_the_value(chart_with_existing):
    existing = {"trainjob": existing_trainjob(1, 8, 3600)}
    with pytest.raises(helm_python.HelmError) as err:
        render_upgrade(
            chart_with_existing, existing, {"runPolicy": {"activeDeadlineSeconds": 7200}}
        )
    assert "runPolicy.activeDeadlineSeconds: the existing TrainJob vision/megdet has 3600" in str(
        err.value
    )


def test_switching_a_live_run_from_pytorchjob_to_trainjob_fails(chart_with_existing):
    meta = {"name": RELEASE, "namespace": NAMESPACE}
    existing = {
        "pytorchjob": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta}
    }
    with pytest.raises(helm_python.HelmError) as err:
        render_upgrade(chart_with_existing, existing, {})
    assert "target=trainjob: the run already has a PyTorchJob vision/megdet" in str(err.value)


SWITCH_LOOKUP = (
    'lookup "trainer.kubeflow.org/v1alpha1" "TrainJob" .Release.Namespace'
    ' (include "megdet.fullname" .)'
)


def test_switching_a_live_run_from_trainjob_to_pytorchjob_fails(tmp_path):
    chart = tmp_path / "megdet"
    shutil.copytree(CHART_DIR, chart)
    template = chart / "templates" / "pytorchjob.yaml"
    text = template.read_text()
    assert text.count(SWITCH_LOOKUP) == 1, "pytorchjob.yaml does not look up a TrainJob"
    template.write_text(
        text.replace(SWITCH_LOOKUP, '.Files.Get "files/existing-trainjob.yaml" | fromYaml')
    )
    (chart / "files" / "existing-trainjob.yaml").write_text(yaml.safe_dump(existing_trainjob(1, 8)))
    with helm_python.Chart.load(str(chart)) as loaded, pytest.raises(helm_python.HelmError) as err:
        loaded.render(values={}, name=RELEASE, namespace=NAMESPACE, is_upgrade=True)
    assert "target=pytorchjob: the run already has a TrainJob vision/megdet" in str(err.value)
