"""Cluster rules in the run chart: locked memory for RDMA, QoS, gang/Kueue fields the
operator would drop, immutable queue on upgrade, name budget, NCCL names, owned overrides."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import helm_python
import pytest
import yaml
from chart_helpers import (
    CHART_DIR,
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    RESTRICTED_CONTAINER_SECURITY,
    ROOT_CONTAINER_SECURITY,
    env_of,
    qos_class,
    values_file,
    values_from,
)

from megdet.naming import DNS_LABEL_MAX, MAX_GPUS, MAX_JOB_NAME_LENGTH
from megdet.overrides import CHART_FILE, OWNED_OVERRIDES, chart_file_text, owned_override_message

REPO = CHART_DIR.parents[1]
IB = ["nccl.ib.enabled=true", "nccl.ib.rdmaResourceName=rdma/rdma_shared_device_a"]
# Pod Security Standards "baseline": the only capabilities a container may add.
BASELINE_CAPS = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


# --- locked memory for RDMA -----------------------------------------------------------------------


def test_ib_with_runtime_memlock_stays_non_root_and_adds_no_capability(render):
    rendered = render(values_from(sets=IB))
    assert rendered.values["nccl"]["ib"]["memlock"] == "runtime"  # the default
    for _, spec in rendered.pod_specs():
        assert spec["securityContext"]["runAsUser"] == 10001
        assert spec["securityContext"]["runAsNonRoot"] is True
        (container,) = spec["containers"]
        # No IPC_LOCK: it would never reach a non-root process's effective set, and adding it
        # would push the pod out of the baseline Pod Security level for nothing.
        added = set(container.get("securityContext", {}).get("capabilities", {}).get("add", []))
        assert added <= BASELINE_CAPS
        assert container["securityContext"] == RESTRICTED_CONTAINER_SECURITY


def test_ib_with_root_memlock_runs_the_container_as_root_with_ipc_lock(render):
    rendered = render(values_from(sets=[*IB, "nccl.ib.memlock=root"]))
    for _, spec in rendered.pod_specs():
        (container,) = spec["containers"]
        assert container["securityContext"] == ROOT_CONTAINER_SECURITY
        # Only the container: the pod keeps fsGroup, so /output stays group-writable.
        assert spec["securityContext"]["fsGroup"] == 10001


def test_root_memlock_without_ib_changes_nothing(render):
    rendered = render(values_from(sets=["nccl.ib.memlock=root"]))
    for _, container in rendered.containers():
        assert container["securityContext"] == RESTRICTED_CONTAINER_SECURITY


@pytest.mark.parametrize(
    ("memlock", "says"),
    [
        ("runtime", "must come from the node's container runtime (RLIMIT_MEMLOCK unlimited)"),
        ("root", "running as root with IPC_LOCK"),
    ],
)
def test_notes_say_where_locked_memory_comes_from_and_how_to_check(render, memlock, says):
    notes = render(values_from(sets=[*IB, f"nccl.ib.memlock={memlock}"])).notes
    assert f"InfiniBand is on (nccl.ib.memlock={memlock})" in notes and says in notes
    assert f"kubectl -n {NAMESPACE} exec {RELEASE}-master-0 -c pytorch -- megdet doctor" in notes


def test_memlock_takes_only_runtime_or_root(render):
    message = render.error(values_from(sets=[*IB, "nccl.ib.memlock=unlimited"]))
    assert "at '/nccl/ib/memlock'" in message and "'runtime', 'root'" in message


# --- gang and Kueue details -----------------------------------------------------------------------


def test_volcano_refuses_a_schedule_timeout_it_would_drop(render):
    message = render.error(
        values_from(sets=["gang.enabled=true", "gang.scheduleTimeoutSeconds=600"])
    )
    assert (
        "gang.scheduleTimeoutSeconds=600 has no effect with gang.schedulerName=volcano" in message
    )


def test_scheduler_plugins_gets_the_schedule_timeout(render):
    rendered = render(
        values_from(
            sets=[
                "gang.enabled=true",
                "gang.schedulerName=scheduler-plugins-scheduler",
                "gang.scheduleTimeoutSeconds=600",
            ]
        )
    )
    policy = rendered.job["spec"]["runPolicy"]["schedulingPolicy"]
    assert policy["scheduleTimeoutSeconds"] == 600
    for _, spec in rendered.pod_specs():
        assert spec["schedulerName"] == "scheduler-plugins-scheduler"


def test_scheduler_plugins_refuses_a_queue_it_would_drop(render):
    message = render.error(
        values_from(
            sets=["gang.enabled=true", "gang.schedulerName=scheduler-plugins", "gang.queue=a"]
        )
    )
    assert 'gang.queue="a" has no effect with gang.schedulerName=scheduler-plugins' in message


def test_kueue_jobs_carry_no_suspend_field(render):
    run_policy = render(values_from(sets=["kueue.queueName=gpu"])).job["spec"]["runPolicy"]
    assert "suspend" not in run_policy
    # Without Kueue the value is rendered, both ways.
    for flag in (False, True):
        rendered = render(values_from(sets=[f"runPolicy.suspend={str(flag).lower()}"]))
        assert rendered.job["spec"]["runPolicy"]["suspend"] is flag


def test_kueue_refuses_runpolicy_suspend(render):
    message = render.error(values_from(sets=["kueue.queueName=gpu", "runPolicy.suspend=true"]))
    assert 'runPolicy.suspend=true with kueue.queueName="gpu": Kueue owns suspend' in message


def test_upgrade_renders_offline_where_lookup_finds_nothing(render):
    files = render.chart.render(
        values=values_from(sets=["gang.enabled=true", "gang.queue=b"]),
        name=RELEASE,
        namespace=NAMESPACE,
        is_upgrade=True,
    )
    job = yaml.safe_load(files["megdet/templates/pytorchjob.yaml"])
    assert job["spec"]["runPolicy"]["schedulingPolicy"]["queue"] == "b"


LOOKUP = '(lookup "kubeflow.org/v1" "PyTorchJob" .Release.Namespace (include "megdet.fullname" .))'


@pytest.fixture(scope="module")
def chart_with_existing_job(tmp_path_factory):
    """A copy of the chart whose upgrade lookup reads files/existing.yaml instead of the cluster.

    helm_python renders offline, where `lookup` returns nothing, so the rule is exercised by
    swapping exactly that call (the swap must find it once: the wiring is part of the test).
    """
    chart = tmp_path_factory.mktemp("chart") / "megdet"
    shutil.copytree(CHART_DIR, chart)
    template = chart / "templates" / "pytorchjob.yaml"
    text = template.read_text()
    assert text.count(LOOKUP) == 1, "pytorchjob.yaml does not look up the existing job"
    template.write_text(text.replace(LOOKUP, '(.Files.Get "files/existing.yaml" | fromYaml)'))
    return chart


def render_against(chart: Path, existing: dict | None, upgrade: bool, **values) -> dict:
    (chart / "files" / "existing.yaml").write_text(yaml.safe_dump(existing) if existing else "")
    with helm_python.Chart.load(str(chart)) as loaded:
        return loaded.render(
            values=values_from(**values),
            name=RELEASE,
            namespace=NAMESPACE,
            is_install=not upgrade,
            is_upgrade=upgrade,
        )


def existing_job(queue: str | None) -> dict:
    policy = {"minAvailable": 1} | ({"queue": queue} if queue is not None else {})
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": RELEASE, "namespace": NAMESPACE},
        "spec": {"runPolicy": {"schedulingPolicy": policy}},
    }


def test_upgrade_that_changes_the_queue_fails_naming_the_value(chart_with_existing_job):
    with pytest.raises(helm_python.HelmError) as err:
        render_against(
            chart_with_existing_job,
            existing_job("training"),
            upgrade=True,
            gang={"enabled": True, "queue": "research"},
        )
    message = str(err.value)
    assert f"gang.queue: the existing PyTorchJob {NAMESPACE}/{RELEASE}" in message
    assert 'schedulingPolicy.queue "training" and this upgrade sets "research"' in message
    assert 'Keep gang.queue="training"' in message


@pytest.mark.parametrize(
    ("old", "gang"),
    [(None, {"enabled": True, "queue": "research"}), ("training", {"enabled": False})],
    ids=["adds-a-queue", "drops-the-gang"],
)
def test_upgrade_that_adds_or_drops_a_queue_fails(chart_with_existing_job, old, gang):
    with pytest.raises(helm_python.HelmError, match=r"gang\.queue: the existing PyTorchJob"):
        render_against(chart_with_existing_job, existing_job(old), upgrade=True, gang=gang)


def test_upgrade_with_the_same_queue_and_installs_pass(chart_with_existing_job):
    same = render_against(
        chart_with_existing_job,
        existing_job("training"),
        upgrade=True,
        gang={"enabled": True, "queue": "training"},
    )
    assert "megdet/templates/pytorchjob.yaml" in same
    # The rule runs on upgrades only: an install does not compare with anything.
    render_against(
        chart_with_existing_job,
        existing_job("training"),
        upgrade=False,
        gang={"enabled": True, "queue": "research"},
    )


# --- QoS ------------------------------------------------------------------------------------------


def test_pods_are_guaranteed_by_default_with_whole_cpus(render):
    rendered = render({})
    for _, container in rendered.containers():
        resources = container["resources"]
        assert resources["limits"]["cpu"] == resources["requests"]["cpu"] == "32"
        assert resources["limits"]["memory"] == resources["requests"]["memory"] == "256Gi"
        assert qos_class(container) == "Guaranteed"


def test_burstable_sets_requests_only(render):
    rendered = render(values_from(sets=["resources.qos=Burstable", "resources.cpu=7.5"]))
    for _, container in rendered.containers():
        assert "cpu" not in container["resources"]["limits"]
        assert qos_class(container) == "Burstable"


@pytest.mark.parametrize("cpu", ["7.5", "500m", "31500m"])
def test_guaranteed_refuses_fractional_cpus(render, cpu):
    message = render.error(values_from(sets=[f"resources.cpu={cpu}"]))
    assert f'resources.cpu="{cpu}" is not a whole number of CPUs' in message
    assert "resources.qos=Burstable" in message


def test_guaranteed_accepts_whole_cpus_in_millicores(render):
    (container,) = [
        c for _, c in render(values_from(sets=["gpus=1", "resources.cpu=8000m"])).containers()
    ]
    assert container["resources"]["limits"]["cpu"] == "8000m"


def test_guaranteed_refuses_a_separate_memory_limit(render):
    message = render.error(values_from(sets=["resources.memoryLimit=300Gi"]))
    assert 'resources.memoryLimit="300Gi": with resources.qos=Guaranteed' in message


# --- names, NCCL level names, restart policy, fsGroup ---------------------------------------------


def test_chart_and_python_share_the_job_name_limit(render):
    assert MAX_JOB_NAME_LENGTH == 50
    ok = render(values_from(fullnameOverride="r" * MAX_JOB_NAME_LENGTH))
    assert ok.job["metadata"]["name"] == "r" * MAX_JOB_NAME_LENGTH
    message = render.error(values_from(fullnameOverride="r" * (MAX_JOB_NAME_LENGTH + 1)))
    assert f"is {MAX_JOB_NAME_LENGTH + 1} characters" in message
    assert f"at most {MAX_JOB_NAME_LENGTH} characters" in message


def test_the_longest_service_name_fits_a_dns_label(render):
    # One pod per GPU at the schema's maximum: the largest Worker index the operator names.
    # naming.py derives the limit from its own copy of that maximum: keep the two equal.
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert schema["properties"]["gpus"]["maximum"] == MAX_GPUS
    rendered = render(
        values_from(fullnameOverride="r" * MAX_JOB_NAME_LENGTH, gpus=MAX_GPUS, gpusPerNode=1)
    )
    workers = rendered.replicas()["Worker"]["replicas"]
    longest = f"{rendered.job['metadata']['name']}-worker-{workers - 1}"
    assert len(longest) == DNS_LABEL_MAX


def test_a_too_long_release_name_fails_instead_of_being_cut(render):
    with pytest.raises(helm_python.HelmError, match="use a shorter release name"):
        render.chart.render(values={}, name="m" * 51, namespace=NAMESPACE, is_install=True)


@pytest.mark.parametrize("level", ["LOC", "PIX", "PXB", "PHB", "SYS"])
def test_gdr_level_takes_nccls_names(render, level):
    rendered = render(values_from(sets=[*IB, f"nccl.ib.gdrLevel={level}"]))
    for _, container in rendered.containers():
        assert env_of(container)["NCCL_NET_GDR_LEVEL"] == level


@pytest.mark.parametrize("level", ["3", "NVL"])
def test_gdr_level_refuses_legacy_integers_and_other_names(render, level):
    values = values_from(
        sets=IB, nccl={"ib": {"gdrLevel": int(level) if level.isdigit() else level}}
    )
    assert "at '/nccl/ib/gdrLevel'" in render.error(values)


def test_restart_policy_always_is_refused(render):
    message = render.error(values_from(sets=["restartPolicy=Always"]))
    assert "at '/restartPolicy'" in message and "'OnFailure', 'Never', 'ExitCode'" in message


def test_output_volume_is_not_rechowned_at_every_start(render):
    for _, spec in render({}).pod_specs():
        assert spec["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"


def test_hostnetwork_example_is_one_coherent_infiniband_setup():
    v = values_file(next(p for p in CI_VALUES if p.name == "hostnetwork-values.yaml"))
    ib = v["nccl"]["ib"]
    assert ib["hca"].count("mlx5_") == v.get("gpusPerNode", 8)  # one ConnectX HCA per GPU
    # The shared device plugin's resource (all HCAs, one unit); nvidia.com/hostdev is a Multus
    # host-device network, which the host network does not use.
    assert ib["rdmaResourceName"] == "rdma/rdma_shared_device_a" and ib["rdmaResourceCount"] == 1
    # No cloud instance type whose NICs are not ConnectX HCAs (p5/p4d carry EFA).
    assert "affinity" not in v and "node.kubernetes.io/instance-type" not in v["nodeSelector"]


# --- owned overrides ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(OWNED_OVERRIDES))
def test_every_owned_override_is_refused_naming_its_value(render, key):
    message = render.error(values_from(extraOverrides={key: 1}))
    assert owned_override_message(key) in message
    assert f"use {OWNED_OVERRIDES[key]}" in message


def test_overrides_of_base_lr_and_images_per_gpu_name_their_values(render):
    for key, value in (("SOLVER.BASE_LR", "baseLr"), ("MEGDET.IMAGES_PER_GPU", "imagesPerGpu")):
        message = render.error(values_from(extraOverrides={key: 0.1}))
        assert f"extraOverrides: {key} is set by the value {value}; use {value}" in message


def test_free_overrides_pass_through_including_top_level_keys(render):
    free = {
        "SEED": 7,
        "TEST.EVAL_PERIOD": 5000,
        "MODEL.WEIGHTS": "/output/w.pth",
        "MEGDET.AMP": True,
    }
    assert not set(free) & set(OWNED_OVERRIDES)
    (container,) = [c for _, c in render(values_from(gpus=1, extraOverrides=free)).containers()]
    args = container["args"]
    for key in free:
        assert key in args


def test_chart_reads_the_list_that_python_owns():
    path = REPO / CHART_FILE
    assert path.read_text() == chart_file_text(), (
        f"{CHART_FILE} is stale: run `python -m megdet.overrides > {CHART_FILE}`"
    )
    assert yaml.safe_load(path.read_text()) == OWNED_OVERRIDES


def test_the_keys_the_chart_passes_itself_are_all_owned(render):
    # Every detectron2 key in megdet.trainArgs (spec fields) must be owned, or an extra override
    # of it would silently win (yacs: the last one does).
    rendered = render(values_from(numWorkers=4))
    _, container = next(rendered.containers())
    args = container["args"]
    last_flag = max(i for i, a in enumerate(args) if a.startswith("--"))
    chart_keys = set(args[last_flag + 2 :: 2])
    assert chart_keys and chart_keys <= set(OWNED_OVERRIDES)


# --- the schema: every field explains itself ------------------------------------------------------


def schema_fields(node: dict, path: str = ""):
    """(path, schema) for every property and pattern property, at any depth, through items."""
    for group in ("properties", "patternProperties"):
        for name, sub in node.get(group, {}).items():
            yield f"{path}.{name}", sub
            yield from schema_fields(sub, f"{path}.{name}")
    items = node.get("items")
    if isinstance(items, dict):
        yield from schema_fields(items, f"{path}[]")


def test_every_schema_field_has_a_description():
    schema = yaml.safe_load((CHART_DIR / "values.schema.json").read_text())
    fields = list(schema_fields(schema))
    assert len(fields) > 60
    missing = [path for path, sub in fields if not str(sub.get("description", "")).strip()]
    assert missing == []
