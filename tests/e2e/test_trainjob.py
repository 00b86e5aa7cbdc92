"""A MegDetRun with `target: trainjob` through the real Kubeflow Trainer v2.3.0 and JobSet v0.12.0
(both webhooks served with the project's certificates) on the real scheduler and kwok's fake
8-GPU nodes, in a namespace that enforces the `restricted` Pod Security profile; then a run with
`kueue.queueName` that Kueue v0.19.0 holds suspended until its ClusterQueue has the GPUs.

The chain under test: the controller creates the run's TrainingRuntime and TrainJob (Trainer's
webhooks admit both), Trainer makes a JobSet (JobSet's webhooks admit it), JobSet makes the
Job, the Job controller the pods, the scheduler binds each 8-GPU pod to a node with 8 GPUs free,
and the TrainJob's status travels back up into the MegDetRun. kwok's stages complete the pods
a Job owns at once (unlike a PyTorchJob's, which run until told otherwise), so on this cluster
a TrainJob run ends Succeeded seconds after its pods start: that is what is checked."""

from __future__ import annotations

import itertools
import json
import time

import pytest
from e2e_helpers import (
    apply_objects,
    ensure_free_gpus,
    eventually,
    get_json,
    get_or_none,
    launch_dry_run,
    mdr,
    namespace,
    pods_of,
    resolve_env,
)
from test_pytorchjob import volumes

NS = "trainjob-e2e"
RUN = "coco-16"
QUEUED = "queued-16"
#: The label JobSet puts on its Jobs and pods (Trainer names the JobSet after the TrainJob).
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
FLAVOR, CLUSTER_QUEUE, LOCAL_QUEUE = "gpu-nodes", "megdet-gpus", "training"


@pytest.fixture(scope="module")
def trainer_v2(kube):
    """JobSet and Trainer v2 on the session's cluster (started here, so that the rest of the
    suite does not wait for them); the time they came up, 0 if they ran already."""
    return time.monotonic() if kube.start_trainer_v2() else 0.0


@pytest.fixture(scope="module")
def ns(kube, trainer_v2, controller):
    if controller.started_at < trainer_v2:
        # It started before TrainJob was served; kopf lists the kinds to watch once.
        controller.restart()
    name = namespace(kube, NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    apply_objects(kube, *volumes(name))
    ensure_free_gpus(kube, 32)  # this module's two 16-GPU runs
    return name


def run_events(kube, ns: str, name: str) -> list[dict]:
    events = get_json(kube, "events", "-n", ns)["items"]
    return [
        e
        for e in events
        if e["involvedObject"].get("kind") == "MegDetRun" and e["involvedObject"]["name"] == name
    ]


def phase(kube, ns: str, name: str) -> str | None:
    run = get_or_none(kube, "mdr", name, "-n", ns)
    return ((run or {}).get("status") or {}).get("phase")


def condition(obj: dict | None, kind: str) -> dict | None:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def run_spec(**extra) -> dict:
    return {
        "gpus": 16,
        "target": "trainjob",
        "dataset": {"claimName": "coco"},
        "output": {"claimName": "megdet-output"},
        "runName": extra.pop("runName"),
        **extra,
    }


def scheduled_pods(kube, ns: str, name: str, count: int) -> list[dict]:
    """The JobSet's pods once each is bound and has finished (kwok completes a Job's pods at
    once), checked for GPUs: each 8-GPU pod fills an 8-GPU node, so two pods share a node
    only one after the other. Apart is what the scheduler does with pods that coexist; when
    kwok completes the first pod before the Job controller's second batch reaches the
    scheduler, the freed node can take the second."""
    pods = eventually(
        lambda: (p := pods_of(kube, ns, f"{JOBSET_LABEL}={name}"))
        and len(p) == count
        and all(x["spec"].get("nodeName") and x["status"].get("phase") == "Succeeded" for x in p)
        and p,
        timeout=90,
        message=f"{count} pods of JobSet {name} scheduled and completed",
    )
    by_node: dict[str, list[dict]] = {}
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
        by_node.setdefault(pod["spec"]["nodeName"], []).append(pod)
    for node, shared in by_node.items():
        spans = sorted((started(p), finished(p)) for p in shared)
        for (_, end), (begin, _) in itertools.pairwise(spans):
            assert end <= begin, f"two 8-GPU pods ran on {node} at once: {spans}"
    return pods


def started(pod: dict) -> str:
    return pod["status"]["startTime"]


def finished(pod: dict) -> str:
    (status,) = pod["status"]["containerStatuses"]
    return status["state"]["terminated"]["finishedAt"]


def test_a_16_gpu_run_goes_through_trainer_and_jobset(kube, ns, controller) -> None:
    apply_objects(kube, mdr(RUN, ns, run_spec(runName=RUN)))

    # Trainer's webhooks admitted both (the TrainJob's validator looks the runtime up), and
    # the controller owns both.
    job = eventually(
        lambda: get_or_none(kube, "trainjob", RUN, "-n", ns), timeout=60, message="the TrainJob"
    )
    runtime = get_json(kube, "trainingruntime", RUN, "-n", ns)
    for obj in (job, runtime):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["kind"] == "MegDetRun" and owner["controller"] is True
    assert job["spec"]["trainer"] == {"numNodes": 2, "numProcPerNode": 8}

    # Trainer made the JobSet from the runtime, owned by the TrainJob; JobSet's webhook
    # defaulted and admitted it, and its controller made one indexed Job of two pods.
    jobset = eventually(
        lambda: get_or_none(kube, "jobset", RUN, "-n", ns), timeout=60, message="the JobSet"
    )
    (owner,) = jobset["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("TrainJob", RUN)
    (replicated,) = jobset["spec"]["replicatedJobs"]
    assert replicated["name"] == "node"
    assert replicated["template"]["spec"]["parallelism"] == 2
    jobs = eventually(
        lambda: get_json(kube, "jobs", "-n", ns, "-l", f"{JOBSET_LABEL}={RUN}")["items"],
        timeout=60,
        message="the JobSet's Job",
    )
    assert [j["metadata"]["name"] for j in jobs] == [f"{RUN}-node-0"]

    # The scheduler bound each 8-GPU pod to a fake node with the GPUs free.
    pods = scheduled_pods(kube, ns, RUN, 2)
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["name"] == "node"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"

    # The pods' end -> the Job -> JobSet's status -> the TrainJob's -> the run. kwok's stages
    # complete a Job's running pods at once (pod-complete selects pods a Job owns; the
    # PyTorchJob path's pods belong to the PyTorchJob and keep running), so the real chain
    # yields Succeeded within seconds: Trainer copies JobSet's Completed condition as
    # Complete, which the controller maps to Succeeded.
    eventually(lambda: phase(kube, ns, RUN) == "Succeeded", timeout=90, message="phase Succeeded")
    job = get_json(kube, "trainjob", RUN, "-n", ns)
    complete = condition(job, "Complete")
    assert complete["status"] == "True" and complete["reason"] == "AllJobsCompleted", job
    (status,) = job["status"]["jobsStatus"]
    assert status["name"] == "node" and status["succeeded"] == 1, job["status"]
    run = get_json(kube, "mdr", RUN, "-n", ns)
    succeeded = condition(run, "Succeeded")
    assert succeeded["status"] == "True" and succeeded["reason"] == "AllJobsCompleted", run
    assert run["status"]["startTime"] and run["status"]["completionTime"], run["status"]
    row = kube.kubectl("get", "mdr", RUN, "-n", ns).stdout.splitlines()[1].split()
    assert row[:5] == [RUN, "Succeeded", "16", "16", "32"]
    # Never refused for good: a TrainJob create that Trainer's webhook answered before its
    # cache saw the TrainingRuntime is retried (Retrying), not a Failed run.
    assert not [e for e in run_events(kube, ns, RUN) if e["reason"] in ("JobRefused", "Failed")]


def test_trainers_env_launches_a_world_of_16(kube, ns) -> None:
    """Trainer's torch plugin, not the chart, sets the rendezvous (PET_* in the `node`
    container, the node rank from the Job's completion index); `megdet launch` turns it into
    torchrun's arguments: world size 16, two nodes of 8, hosted by node rank 0's pod."""
    hosts = {}
    for pod in pods_of(kube, ns, f"{JOBSET_LABEL}={RUN}"):
        env = resolve_env(pod)
        assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "8", env
        # Pod 0 of the JobSet's Job, by its hostname in the JobSet's headless Service.
        assert env["PET_MASTER_ADDR"] == f"{RUN}-node-0-0.{RUN}", env
        args = launch_dry_run(env)
        assert "world size 16:" in " ".join(args), args
        assert f"--rdzv-endpoint={RUN}-node-0-0.{RUN}:29500" in args, args
        assert "--nnodes=2:2" in args and "--nproc-per-node=8" in args, args
        index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        hosts[index] = next(a.split("=")[-1] for a in args if a.startswith("--rdzv-conf="))
    assert hosts == {"0": "1", "1": "0"}


def test_pods_meet_the_restricted_profile(kube, ns) -> None:
    """The namespace enforces `restricted`: the Job controller could create the pods at all,
    with what Trainer and JobSet added to the runtime's template."""
    for pod in pods_of(kube, ns, f"{JOBSET_LABEL}={RUN}"):
        spec = pod["spec"]
        assert spec.get("automountServiceAccountToken") is False
        ctx = spec["containers"][0]["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"]["drop"] == ["ALL"]
    events = json.loads(kube.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    assert not [e for e in events if "violates PodSecurity" in e.get("message", "")]


# -- Kueue -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def queue(kube, ns):
    """Kueue with a ClusterQueue that has no GPUs yet, and a LocalQueue in the namespace."""
    kube.start_kueue()
    apply_objects(
        kube,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR},
            "spec": {"nodeLabels": {"type": "kwok"}},
        },
        cluster_queue(gpus=0),
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": ns},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    )
    return LOCAL_QUEUE


def cluster_queue(gpus: int) -> dict:
    quotas = {"cpu": "1k", "memory": "64Ti", "nvidia.com/gpu": str(gpus)}
    resources = [{"name": k, "nominalQuota": v} for k, v in quotas.items()]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": list(quotas),
                    "flavors": [{"name": FLAVOR, "resources": resources}],
                }
            ],
        },
    }


def workload_of(kube, ns: str, job: str) -> dict | None:
    items = get_json(kube, "workloads.kueue.x-k8s.io", "-n", ns)["items"]
    return next(
        (w for w in items if any(o["name"] == job for o in w["metadata"]["ownerReferences"])),
        None,
    )


def test_a_queued_run_waits_suspended_until_kueue_admits_it(kube, ns, queue) -> None:
    # The first run is done with (the ns fixture left room for both on the nodes).
    kube.kubectl("delete", "mdr", RUN, "-n", ns, "--wait=false")
    apply_objects(kube, mdr(QUEUED, ns, run_spec(runName=QUEUED, kueue={"queueName": queue})))

    # Kueue's TrainJob webhook suspended it on create (the chart renders no suspend with a
    # queue); Trainer marks it Suspended and the run mirrors that.
    job = eventually(
        lambda: get_or_none(kube, "trainjob", QUEUED, "-n", ns), timeout=60, message="TrainJob"
    )
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == queue
    eventually(
        lambda: phase(kube, ns, QUEUED) == "Suspended", timeout=60, message="phase Suspended"
    )
    # Kueue made a Workload for it, sized from the runtime, and cannot fit it: no GPU quota.
    workload = eventually(
        lambda: workload_of(kube, ns, QUEUED), timeout=60, message="the TrainJob's Workload"
    )
    (podset,) = workload["spec"]["podSets"]
    assert podset["count"] == 2
    eventually(
        lambda: (c := condition(workload_of(kube, ns, QUEUED), "QuotaReserved"))
        and c["status"] == "False"
        and "nvidia.com/gpu" in c["message"],
        timeout=60,
        message="Workload pending for GPU quota",
    )
    # Kueue has decided (no quota: the Workload pending): the TrainJob stays suspended, and
    # its JobSet too, so no pod exists.
    assert get_json(kube, "trainjob", QUEUED, "-n", ns)["spec"]["suspend"] is True
    assert phase(kube, ns, QUEUED) == "Suspended"
    assert not pods_of(kube, ns, f"{JOBSET_LABEL}={QUEUED}")

    # The ClusterQueue gets 16 GPUs: Kueue admits the Workload and resumes the TrainJob, with
    # its flavor's node labels as a runtime patch; Trainer resumes the JobSet; the pods run ...
    apply_objects(kube, cluster_queue(gpus=16))
    eventually(
        lambda: (c := condition(workload_of(kube, ns, QUEUED), "Admitted"))
        and c["status"] == "True",
        timeout=60,
        message="Workload admitted",
    )
    pods = scheduled_pods(kube, ns, QUEUED, 2)
    for pod in pods:
        assert pod["spec"].get("nodeSelector", {}).get("type") == "kwok", pod["spec"]
    # ... and, as kwok completes a Job's pods, the run ends Succeeded (see the first test).
    eventually(
        lambda: phase(kube, ns, QUEUED) == "Succeeded", timeout=90, message="phase Succeeded"
    )
    job = get_json(kube, "trainjob", QUEUED, "-n", ns)
    assert job["spec"]["suspend"] is False
    patches = job["spec"].get("runtimePatches") or []
    assert [p["manager"] for p in patches] == ["kueue.x-k8s.io/manager"], patches
    run = get_json(kube, "mdr", QUEUED, "-n", ns)
    suspended = condition(run, "Suspended")
    assert suspended is not None and suspended["status"] == "False", run["status"]


# -- A refusal that heals --------------------------------------------------------------------

QUOTA_NS, QUOTA_RUN = "trainjob-quota-e2e", "quota-8"
TRAINJOB_COUNT = "count/trainjobs.trainer.kubeflow.org"


def quota(jobs: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "trainjobs", "namespace": QUOTA_NS},
        "spec": {"hard": {TRAINJOB_COUNT: str(jobs)}},
    }


def test_a_quota_refusal_is_retried_until_the_quota_has_room(kube, ns) -> None:
    """The real quota admission plugin refuses the TrainJob (403 "exceeded quota"): the run
    waits Pending, Created=False reason Retrying, the runtime already created; once the quota
    has room the retry creates the TrainJob. Held suspended: no GPU is needed."""
    name = namespace(kube, QUOTA_NS)
    apply_objects(kube, *volumes(name), quota(0))
    eventually(
        lambda: (get_json(kube, "resourcequota", "trainjobs", "-n", name).get("status") or {})
        .get("hard", {})
        .get(TRAINJOB_COUNT)
        == "0",
        timeout=60,
        message="the quota's usage computed by the controller-manager",
    )
    spec = run_spec(runName=QUOTA_RUN, gpus=8, runPolicy={"suspend": True})
    apply_objects(kube, mdr(QUOTA_RUN, name, spec))
    created = eventually(
        lambda: (c := condition(get_or_none(kube, "mdr", QUOTA_RUN, "-n", name), "Created"))
        and c["reason"] == "Retrying"
        and c,
        timeout=60,
        message="Created=False reason Retrying",
    )
    # Both are the quota admission's refusals that heal: "status unknown" while its cache has
    # not seen the quota's usage yet (seen on a loaded machine), then "exceeded".
    quota_words = ("exceeded quota: trainjobs", "status unknown for quota: trainjobs")
    assert created["status"] == "False"
    assert any(words in created["message"] for words in quota_words), created["message"]
    assert "HTTP 403 Forbidden" in created["message"] and "Not final" in created["message"]
    assert phase(kube, name, QUOTA_RUN) == "Pending"
    assert get_or_none(kube, "trainingruntime", QUOTA_RUN, "-n", name) is not None
    assert get_or_none(kube, "trainjob", QUOTA_RUN, "-n", name) is None

    apply_objects(kube, quota(1))
    job = eventually(
        lambda: get_or_none(kube, "trainjob", QUOTA_RUN, "-n", name),
        timeout=120,  # the retry's backoff, at most a minute
        message="the TrainJob created once the quota has room",
    )
    assert job["spec"]["suspend"] is True
    eventually(lambda: phase(kube, name, QUOTA_RUN) == "Suspended", timeout=60, message="Suspended")
    run = get_json(kube, "mdr", QUOTA_RUN, "-n", name)
    assert (
        condition(run, "Created")["status"] == "True"
        and run["status"]["jobUID"] == (job["metadata"]["uid"])
    )
    reasons = [e["reason"] for e in run_events(kube, name, QUOTA_RUN) if e["type"] == "Warning"]
    assert reasons.count("Retrying") == 1 and "JobRefused" not in reasons, reasons
