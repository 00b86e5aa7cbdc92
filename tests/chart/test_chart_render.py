"""The PyTorchJob the chart renders: replicas, GPUs, RDMA, env, volumes, scheduling."""

from __future__ import annotations

import itertools

import pytest
from chart_helpers import (
    CI_VALUES,
    RELEASE,
    RESTRICTED_CONTAINER_SECURITY,
    ROOT_CONTAINER_SECURITY,
    env_of,
    flags_of,
    overrides_of,
    qos_class,
    values_file,
    values_from,
)

from megdet.naming import MAX_JOB_NAME_LENGTH
from megdet.plan import plan_run

RDMA = "rdma/hca_shared_devices_a"

MATRIX = list(
    itertools.product(
        [1, 2, 8, 16, 64],  # gpus
        [None, "runtime", "root"],  # InfiniBand off, or on with nccl.ib.memlock
        [False, True],  # hostNetwork
        [False, True],  # gang scheduling
    )
)


def matrix_values(gpus: int, ib: str | None, host_network: bool, gang: bool) -> dict:
    sets = [f"gpus={gpus}", f"network.hostNetwork={str(host_network).lower()}"]
    if ib:
        sets += ["nccl.ib.enabled=true", f"nccl.ib.rdmaResourceName={RDMA}", "nccl.ib.hca=mlx5"]
        sets += [f"nccl.ib.memlock={ib}"]
    if gang:
        sets += ["gang.enabled=true", "gang.queue=research"]
    return values_from(sets=sets)


def assert_job_structure(rendered) -> None:
    """What every render must satisfy, whatever the values."""
    v = rendered.values
    plan = plan_run({k: v[k] for k in ("gpus", "gpusPerNode", "imagesPerGpu")})
    job = rendered.job
    replicas = rendered.replicas()

    # One Master; nodes - 1 Workers; a single-node run has no Worker entry at all.
    assert replicas["Master"]["replicas"] == 1
    if plan.nodes == 1:
        assert set(replicas) == {"Master"}
    else:
        assert replicas["Worker"]["replicas"] == plan.nodes - 1
    # nprocPerNode is a string integer, so the operator's WORLD_SIZE = pods x procs is right.
    assert job["spec"]["nprocPerNode"] == str(plan.procs_per_node)
    pods = sum(r["replicas"] for r in replicas.values())
    assert pods * int(job["spec"]["nprocPerNode"]) == plan.world_size

    ib = v["nccl"]["ib"]["enabled"]
    for role, spec in rendered.pod_specs():
        (container,) = spec["containers"]
        assert container["name"] == "pytorch", role
        res = container["resources"]
        assert res["requests"][v["gpuResource"]] == plan.procs_per_node
        assert res["limits"][v["gpuResource"]] == plan.procs_per_node
        rdma = v["nccl"]["ib"]["rdmaResourceName"]
        env = env_of(container)
        if ib and v["nccl"]["ib"]["memlock"] == "root":
            # IPC_LOCK reaches the effective set only of a root process (kubernetes#56374).
            assert container["securityContext"] == ROOT_CONTAINER_SECURITY
        else:
            # memlock=runtime (or no IB): the image's user, every capability dropped.
            assert container["securityContext"] == RESTRICTED_CONTAINER_SECURITY
        assert spec["automountServiceAccountToken"] is False
        if ib:
            count = v["nccl"]["ib"]["rdmaResourceCount"]
            assert res["requests"][rdma] == res["limits"][rdma] == count
            assert env["NCCL_IB_DISABLE"] == "0"
        else:
            assert not any(k.startswith("rdma/") for k in res["requests"])
            assert env["NCCL_IB_DISABLE"] == "1"
            assert "NCCL_IB_HCA" not in env
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == str(v["nccl"]["asyncErrorHandling"])
        assert qos_class(container) == v["resources"]["qos"]
        if v["podSecurityContext"]:
            assert spec["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"

        volumes = {vol["name"]: vol for vol in spec["volumes"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/data"]["readOnly"] is True
        assert volumes["data"]["persistentVolumeClaim"] == {
            "claimName": v["dataset"]["claimName"],
            "readOnly": True,
        }
        assert not mounts["/output"].get("readOnly", False)
        assert volumes["output"]["persistentVolumeClaim"]["claimName"] == v["output"]["claimName"]
        assert mounts["/dev/shm"]["name"] == "dshm"
        assert volumes["dshm"]["emptyDir"] == {
            "medium": "Memory",
            "sizeLimit": v["shm"]["sizeLimit"],
        }

        if v["network"]["hostNetwork"]:
            assert spec["hostNetwork"] is True
            assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        else:
            assert "hostNetwork" not in spec and "dnsPolicy" not in spec
        if v["gang"]["enabled"]:
            assert spec["schedulerName"] == v["gang"]["schedulerName"]
        else:
            assert "schedulerName" not in spec

    # Kueue suspends and resumes the job: the chart must not write suspend back on upgrade.
    assert ("suspend" in job["spec"]["runPolicy"]) == (not v["kueue"]["queueName"])
    scheduling = job["spec"]["runPolicy"].get("schedulingPolicy")
    if v["gang"]["enabled"]:
        assert scheduling["minAvailable"] == plan.nodes
    else:
        assert scheduling is None


@pytest.mark.parametrize(("gpus", "ib", "host_network", "gang"), MATRIX)
def test_matrix_renders_a_correct_job(render, gpus, ib, host_network, gang):
    rendered = render(matrix_values(gpus, ib, host_network, gang))
    assert_job_structure(rendered)
    if ib:
        _, container = next(rendered.containers())
        assert env_of(container)["NCCL_IB_HCA"] == "mlx5"
    if gang:
        assert rendered.job["spec"]["runPolicy"]["schedulingPolicy"]["queue"] == "research"


@pytest.mark.parametrize("path", CI_VALUES, ids=lambda p: p.name)
def test_ci_values_render_a_correct_job(render, path):
    assert_job_structure(render(values_file(path)))


def test_multinode_ib_ci_values_reach_every_pod(render):
    v = values_file(next(p for p in CI_VALUES if p.name == "multinode-ib-values.yaml"))
    rendered = render(v)
    job = rendered.job
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    run_policy = job["spec"]["runPolicy"]
    assert run_policy == {
        "backoffLimit": 5,
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": 86400,
        "activeDeadlineSeconds": 172800,
        "schedulingPolicy": {
            "minAvailable": 2,
            "queue": "training",
            "priorityClass": "high-priority",
        },
    }
    for role, replica in rendered.replicas().items():
        meta, spec = replica["template"]["metadata"], replica["template"]["spec"]
        assert meta["annotations"] == {
            "example.com/team": "vision",
            "k8s.v1.cni.cncf.io/networks": "default/ib-sriov",
        }
        assert meta["labels"]["team"] == "vision"
        assert meta["labels"]["app.kubernetes.io/component"] == role.lower()
        assert spec["priorityClassName"] == "high-priority"
        assert spec["nodeSelector"] == v["nodeSelector"]
        assert spec["tolerations"] == v["tolerations"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        env = env_of(spec["containers"][0])
        assert {k: env[k] for k in env if k.startswith("NCCL_")} == {
            "NCCL_DEBUG": "INFO",
            "NCCL_DEBUG_SUBSYS": "INIT,NET",
            "NCCL_SOCKET_IFNAME": "eth0",
            "NCCL_IB_DISABLE": "0",
            "NCCL_IB_HCA": "mlx5",
            "NCCL_IB_GID_INDEX": "3",
            "NCCL_IB_TIMEOUT": "22",
            "NCCL_NET_GDR_LEVEL": "PHB",
        }


def test_trainer_args_carry_the_spec_fields_and_paths(render):
    v = values_file(next(p for p in CI_VALUES if p.name == "small-nodes-values.yaml"))
    rendered = render(v)
    for _, container in rendered.containers():
        args = container["args"]
        assert "command" not in container  # the image's ENTRYPOINT (megdet launch) stays
        assert args[:3] == ["train", "--config", "/config/my_megdet.yaml"]
        assert (
            flags_of(args).items()
            >= {
                "--config": "/config/my_megdet.yaml",
                "--output": "/output/r50-8gpu-acc2",
                "--train-json": "/data/annotations/instances_train2017.json",
                "--train-images": "/data/train2017",
                "--val-json": "/data/annotations/instances_val2017.json",
                "--val-images": "/data/val2017",
            }.items()
        )
        # These among them: tests/chart/test_chart_run_values.py holds the whole set of the
        # chart's own flags and keys equal to megdet/run_values.py.
        assert (
            overrides_of(args).items()
            >= {
                "MEGDET.IMAGES_PER_GPU": "2",
                "MEGDET.ACCUMULATION_STEPS": "2",
                "SOLVER.BASE_LR": "0.01",
                "MEGDET.REFERENCE_BATCH": "16",
                "MEGDET.SCALING": "linear",
                "MEGDET.SCHEDULE": "step",
                "SOLVER.MAX_ITER": "90000",
                "SOLVER.STEPS": "(60000, 80000)",
                "SOLVER.WARMUP_ITERS": "1000",
                "MEGDET.SYNC_BN": "backbone",
                "MEGDET.BN_GROUP_SIZE": "0",
                "MEGDET.RESIZE": "keep-batch",
                "MEGDET.METRICS.PORT": "9477",
                "DATALOADER.NUM_WORKERS": "6",
                # extraOverrides, sorted by key; booleans as Python literals for yacs.
                "MEGDET.AMP": "True",
                "MODEL.WEIGHTS": "/output/pretrained/R-50.pth",
                "SOLVER.CHECKPOINT_PERIOD": "2500",
                "TEST.EVAL_PERIOD": "5000",
            }.items()
        )
        env = env_of(container)
        assert env["OMP_NUM_THREADS"] == "4"
        assert list(env)[-1] == "OMP_NUM_THREADS"  # extraEnv comes after the chart's own
        assert container["resources"]["limits"]["memory"] == "160Gi"
        assert {"name": "config", "mountPath": "/config", "readOnly": True} in container[
            "volumeMounts"
        ]


def test_the_resize_mode_reaches_the_trainer(render):
    rendered = render({"gpus": 16, "elastic": {"minGpus": 8, "maxGpus": 32, "resize": "rescale"}})
    for _, container in rendered.containers():
        assert overrides_of(container["args"])["MEGDET.RESIZE"] == "rescale"


def test_elastic_bounds_that_do_not_hold_gpus_fail_naming_gpus_and_the_bounds(render):
    message = render.error({"gpus": 16, "elastic": {"minGpus": 24, "maxGpus": 32}})
    assert "gpus=16 is outside elastic.minGpus=24..elastic.maxGpus=32" in message


def test_output_folder_defaults_to_the_release_name_and_eval_can_be_off(render):
    rendered = render(values_file(next(p for p in CI_VALUES if "single-gpu" in p.name)))
    _, container = next(rendered.containers())
    flags = flags_of(container["args"])
    assert flags["--output"] == f"/output/{RELEASE}"
    assert "--val-json" not in flags and "--val-images" not in flags
    assert "--num-workers" not in flags  # torchrun spawns the processes in a pod
    assert "DATALOADER.NUM_WORKERS" not in overrides_of(container["args"])


def test_base_lr_stays_a_float_and_single_step_stays_a_tuple(render):
    # yacs refuses an int where the config holds a float, and "(60000)" is an int in Python.
    rendered = render(values_from(sets=["baseLr=1", "steps={60000}"]))
    _, container = next(rendered.containers())
    overrides = overrides_of(container["args"])
    assert overrides["SOLVER.BASE_LR"] == "1.0"
    assert overrides["SOLVER.STEPS"] == "(60000,)"


def test_long_derived_names_are_truncated_to_the_job_name_budget(render):
    rendered = render(values_from(nameOverride="n" * 63))
    name = rendered.job["metadata"]["name"]
    assert name == ("megdet-" + "n" * 63)[:MAX_JOB_NAME_LENGTH]
    labels = rendered.job["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert labels["app.kubernetes.io/name"] == "n" * 63
    assert labels["app.kubernetes.io/instance"] == RELEASE


def test_pods_run_as_the_image_user_and_get_time_to_checkpoint_on_sigterm(render):
    rendered = render(values_from(sets=["gpus=16", "terminationGracePeriodSeconds=600"]))
    for _, spec in rendered.pod_specs():
        assert spec["terminationGracePeriodSeconds"] == 600
        # The image's user (Dockerfile: 10001) owns files written to the output volume.
        assert spec["securityContext"]["runAsUser"] == 10001
        assert spec["securityContext"]["fsGroup"] == 10001


def test_pod_security_context_can_be_left_to_the_cluster(render):
    rendered = render(values_from(sets=["podSecurityContext=null"]))
    for _, spec in rendered.pod_specs():
        assert "securityContext" not in spec


def test_pod_security_context_null_leaves_it_to_the_cluster(render):
    """values.yaml says null clears the pod securityContext; {} only merges with the defaults."""
    cleared = render({"podSecurityContext": None})
    assert all("securityContext" not in spec for _, spec in cleared.pod_specs())
    merged = render({"podSecurityContext": {}})
    assert all(spec["securityContext"]["runAsUser"] == 10001 for _, spec in merged.pod_specs())
