"""A 16-GPU MegDetRun through each job target on the real scheduler and kwok's fake 8-GPU
nodes, in a namespace that enforces the `restricted` Pod Security profile:

- ``pytorchjob``: the real Kubeflow training operator (v1.9, its validating webhook served with
  the project's certificates) makes the Master and Worker pods and their Services;
- ``trainjob``: Kubeflow Trainer v2.3.0 and JobSet v0.12.0 (both webhooks served the same way):
  the controller creates the run's TrainingRuntime and TrainJob, Trainer a JobSet, JobSet the
  Job, the Job controller the pods, and the TrainJob's status travels back up into the run.

The same three checks for both: the run becomes its owned job whose pods the scheduler binds,
one 8-GPU pod per fake node that holds it; the env the operator put into the pods is what
`megdet launch` turns into a world of 16; the pods meet `restricted`. What only one target has
(the JobSet chain, Kueue, a quota refusal) is in test_trainjob.py.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from e2e_helpers import (
    apply_objects,
    eventually,
    get_json,
    get_or_none,
    launch_dry_run,
    mdr,
    pods_of,
    resolve_env,
    run_namespace,
    run_phase,
)

RUN = "coco-16"
#: The label JobSet puts on its Jobs and pods (Trainer names the JobSet after the TrainJob).
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


@dataclass(frozen=True)
class Target:
    name: str
    namespace: str
    job_kind: str
    #: The label the operator puts on the job's pods (its value: the job's name).
    pod_label: str
    #: Where the pods' rendezvous is: the operator's, not the chart's.
    rdzv_endpoint: str
    #: The run's phase once its pods are bound. kwok's stages complete the pods a Job owns at
    #: once, so a TrainJob run ends Succeeded seconds after its pods start; a PyTorchJob's pods
    #: belong to the PyTorchJob and keep running.
    phase: str
    #: Which pod hosts the rendezvous: a key of the pod -> ``is_host`` (from --rdzv-conf).
    pod_key: Callable[[dict], str]
    hosts: dict[str, str]


TARGETS = {
    "pytorchjob": Target(
        name="pytorchjob",
        namespace="vision-e2e",
        job_kind="pytorchjob",
        pod_label="training.kubeflow.org/job-name",
        rdzv_endpoint=f"{RUN}-master-0:23456",
        phase="Running",
        pod_key=lambda pod: pod["metadata"]["name"],
        # c10d rendezvous on the Master's Service; torchrun numbers the nodes as they join and
        # the Master's node (node rank 0's pod) hosts the store.
        hosts={f"{RUN}-master-0": "1", f"{RUN}-worker-0": "0"},
    ),
    "trainjob": Target(
        name="trainjob",
        namespace="trainjob-e2e",
        job_kind="trainjob",
        pod_label=JOBSET_LABEL,
        # Pod 0 of the JobSet's Job, by its hostname in the JobSet's headless Service.
        rdzv_endpoint=f"{RUN}-node-0-0.{RUN}:29500",
        phase="Succeeded",
        pod_key=lambda pod: pod["metadata"]["annotations"][
            "batch.kubernetes.io/job-completion-index"
        ],
        hosts={"0": "1", "1": "0"},
    ),
}


@pytest.fixture(scope="module", params=list(TARGETS))
def target(request, kube, controller) -> Target:
    target = TARGETS[request.param]
    if target.name == "trainjob" and kube.start_trainer_v2():
        # JobSet and Trainer v2 came up just now (not at the session's start, so that the rest
        # of the suite does not wait for them); kopf lists the kinds to watch once.
        controller.restart()
    ns = run_namespace(kube, target.namespace, gpus=16)
    spec = {"gpus": 16, "dataset": {"claimName": "coco"}, "output": {"claimName": "megdet-output"}}
    if target.name == "trainjob":
        spec["target"] = "trainjob"
    apply_objects(kube, mdr(RUN, ns, spec))
    return target


def scheduled_pods(kube, ns: str, selector: str, completed: bool, count: int = 2) -> list[dict]:
    """The pods of ``selector`` once each is bound (and, with ``completed``, has finished),
    checked for GPUs: each 8-GPU pod fills an 8-GPU node, so two pods share a node only one
    after the other. Apart is what the scheduler does with pods that coexist; when kwok
    completes a Job's first pod before the Job controller's second batch reaches the
    scheduler, the freed node can take the second."""
    done = ("Succeeded",) if completed else ("Pending", "Running", "Succeeded")
    pods = eventually(
        lambda: (p := pods_of(kube, ns, selector))
        and len(p) == count
        # bound and started: startTime is written when the node's kubelet (kwok's) takes the
        # pod, a moment after the binding; a bound pod without it was read too soon
        and all(
            x["spec"].get("nodeName")
            and x["status"].get("startTime")
            and x["status"].get("phase") in done
            for x in p
        )
        and p,
        timeout=90,
        message=f"{count} pods of {selector} scheduled" + (" and completed" if completed else ""),
    )
    by_node: dict[str, list[dict]] = {}
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        by_node.setdefault(pod["spec"]["nodeName"], []).append(pod)
    for node, shared in by_node.items():
        spans = sorted((pod["status"]["startTime"], finished(pod)) for pod in shared)
        for (_, end), (begin, _) in itertools.pairwise(spans):
            assert end <= begin, f"two 8-GPU pods ran on {node} at once: {spans}"
    return pods


def finished(pod: dict) -> str:
    """When the pod's container ended; a running one has not ended (sorts after any time)."""
    (status,) = pod["status"].get("containerStatuses") or [{}]
    return (status.get("state") or {}).get("terminated", {}).get("finishedAt") or "~"


def target_pods(kube, target: Target) -> list[dict]:
    selector = f"{target.pod_label}={RUN}"
    return scheduled_pods(kube, target.namespace, selector, completed=target.phase == "Succeeded")


def test_a_16_gpu_run_becomes_its_owned_job_and_two_bound_pods(kube, target) -> None:
    ns = target.namespace
    job = eventually(
        lambda: get_or_none(kube, target.job_kind, RUN, "-n", ns),
        timeout=60,
        message=f"the controller's {target.job_kind}",
    )
    (owner,) = job["metadata"]["ownerReferences"]
    assert owner["kind"] == "MegDetRun" and owner["controller"] is True
    if target.name == "pytorchjob":
        replicas = job["spec"]["pytorchReplicaSpecs"]
        assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 1
    else:
        assert job["spec"]["trainer"] == {"numNodes": 2, "numProcPerNode": 8}

    target_pods(kube, target)
    if target.name == "pytorchjob":
        # The real operator made a Service per replica (the rendezvous is the Master's).
        services = {s["metadata"]["name"] for s in get_json(kube, "services", "-n", ns)["items"]}
        assert {f"{RUN}-master-0", f"{RUN}-worker-0"} <= services

    eventually(
        lambda: run_phase(kube, ns, RUN) == target.phase,
        timeout=90,
        message=f"MegDetRun phase {target.phase}",
    )
    header, row = kube.kubectl("get", "mdr", RUN, "-n", ns).stdout.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "PHASE", "GPUS", "WORLD", "BATCH"]
    assert row.split()[:5] == [RUN, target.phase, "16", "16", "32"]


def test_the_operators_env_launches_a_world_of_16(kube, target) -> None:
    """The env the operator put into the pods (the training operator's MASTER_*/PET_*; for a
    TrainJob, Trainer's torch plugin with the node rank from the Job's completion index), read
    back from the API server, is what `megdet launch` turns into torchrun's arguments: world
    size 16, two nodes of 8, the rendezvous at the operator's address, hosted by node rank 0's
    pod."""
    hosts = {}
    for pod in target_pods(kube, target):
        env = resolve_env(pod)
        args = launch_dry_run(env)
        assert "world size 16:" in " ".join(args), args
        assert f"--rdzv-endpoint={target.rdzv_endpoint}" in args, args
        assert "--nnodes=2:2" in args and "--nproc-per-node=8" in args, args
        hosts[target.pod_key(pod)] = next(
            a.split("=")[-1] for a in args if a.startswith("--rdzv-conf=")
        )
    assert hosts == target.hosts


def test_pods_meet_the_restricted_profile(kube, target) -> None:
    """The namespace enforces `restricted`: that the operator (or the Job controller, with what
    Trainer and JobSet added to the runtime's template) could create the pods at all is the
    server's verdict; check what it let through."""
    pods = target_pods(kube, target)
    for pod in pods:
        spec = pod["spec"]
        assert spec.get("automountServiceAccountToken") is False
        ctx = spec["containers"][0]["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"]["drop"] == ["ALL"]
        non_root = ctx.get("runAsNonRoot", spec.get("securityContext", {}).get("runAsNonRoot"))
        assert non_root is True, (ctx, spec.get("securityContext"))
    events = get_json(kube, "events", "-n", target.namespace)["items"]
    assert not [e for e in events if "violates PodSecurity" in e.get("message", "")], json.dumps(
        events
    )[-2000:]
