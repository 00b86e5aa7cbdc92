"""What only the TrainJob target has, on the real control plane: a run with `kueue.queueName`
that Kueue v0.19.0 holds suspended until its ClusterQueue has the GPUs, then resumes through the
whole chain of Kubeflow Trainer v2.3.0 and JobSet v0.12.0 (both webhooks served with the
project's certificates) to Succeeded; and a quota refusal that heals. The checks both targets
share (an owned job, bound pods, the launch env, `restricted`) are in test_run_targets.py.

The chain: the controller creates the run's TrainingRuntime and TrainJob (Trainer's webhooks
admit both), Trainer makes a JobSet (JobSet's webhooks admit it), JobSet makes the Job, the Job
controller the pods, the scheduler binds each 8-GPU pod to a node with 8 GPUs free, and the
TrainJob's status travels back up into the MegDetRun. kwok's stages complete the pods a Job owns
at once, so on this cluster a TrainJob run ends Succeeded seconds after its pods start."""

from __future__ import annotations

import pytest
from e2e_helpers import (
    apply_objects,
    claim_volumes,
    condition,
    eventually,
    get_json,
    get_or_none,
    mdr,
    namespace,
    pods_of,
    run_namespace,
    run_phase,
)
from test_run_targets import JOBSET_LABEL, scheduled_pods

NS = "trainjob-queue-e2e"
QUEUED = "queued-16"
FLAVOR, CLUSTER_QUEUE, LOCAL_QUEUE = "gpu-nodes", "megdet-gpus", "training"


@pytest.fixture(scope="module")
def ns(kube, controller):
    if kube.start_trainer_v2():
        # JobSet and Trainer v2 came up just now; kopf lists the kinds to watch once.
        controller.restart()
    return run_namespace(kube, NS, gpus=16)


def run_events(kube, ns: str, name: str) -> list[dict]:
    events = get_json(kube, "events", "-n", ns)["items"]
    return [
        e
        for e in events
        if e["involvedObject"].get("kind") == "MegDetRun" and e["involvedObject"]["name"] == name
    ]


def run_spec(**extra) -> dict:
    return {
        "gpus": 16,
        "target": "trainjob",
        "dataset": {"claimName": "coco"},
        "output": {"claimName": "megdet-output"},
        "runName": extra.pop("runName"),
        **extra,
    }


# -- Kueue -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def queue(kube, ns, controller):
    """Kueue with a ClusterQueue that has no GPUs yet, and a LocalQueue in the namespace."""
    if kube.start_kueue():
        # kopf lists the kinds to watch once: the controller watches Workloads from now on.
        controller.restart()
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


def test_a_queued_run_waits_suspended_until_kueue_admits_it_then_runs_through_jobset(
    kube, ns, queue
) -> None:
    apply_objects(kube, mdr(QUEUED, ns, run_spec(runName=QUEUED, kueue={"queueName": queue})))

    # Trainer's webhooks admitted both (the TrainJob's validator looks the runtime up), and
    # the controller owns both. Kueue's TrainJob webhook suspended it on create (the chart
    # renders no suspend with a queue); Trainer marks it Suspended and the run mirrors that.
    job = eventually(
        lambda: get_or_none(kube, "trainjob", QUEUED, "-n", ns), timeout=60, message="TrainJob"
    )
    runtime = get_json(kube, "trainingruntime", QUEUED, "-n", ns)
    for obj in (job, runtime):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["kind"] == "MegDetRun" and owner["controller"] is True
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == queue
    eventually(
        lambda: run_phase(kube, ns, QUEUED) == "Suspended", timeout=60, message="phase Suspended"
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
    assert run_phase(kube, ns, QUEUED) == "Suspended"
    assert not pods_of(kube, ns, f"{JOBSET_LABEL}={QUEUED}")
    # The run says why, in Kueue's words (controller/lifecycle.py): Admitted=False with the
    # Workload's QuotaReserved reason and message, and the Stage column says Queued.
    reserved = condition(workload_of(kube, ns, QUEUED), "QuotaReserved")
    admitted = eventually(
        lambda: (c := condition(get_json(kube, "mdr", QUEUED, "-n", ns), "Admitted"))
        and c["message"] == reserved["message"]
        and c,
        timeout=30,
        message="the run's Admitted condition with Kueue's message",
    )
    assert (admitted["status"], admitted["reason"]) == ("False", reserved["reason"])
    assert admitted["lastTransitionTime"] == reserved["lastTransitionTime"]
    header, row = kube.kubectl("get", "mdr", QUEUED, "-n", ns).stdout.splitlines()[:2]
    assert row[header.index("STAGE") :].split()[0] == "Queued"  # columns are aligned

    # The ClusterQueue gets 16 GPUs: Kueue admits the Workload and resumes the TrainJob, with
    # its flavor's node labels as a runtime patch; Trainer resumes the JobSet; the pods run ...
    apply_objects(kube, cluster_queue(gpus=16))
    eventually(
        lambda: (c := condition(workload_of(kube, ns, QUEUED), "Admitted"))
        and c["status"] == "True",
        timeout=60,
        message="Workload admitted",
    )
    eventually(
        lambda: condition(get_json(kube, "mdr", QUEUED, "-n", ns), "Admitted")["status"] == "True",
        timeout=30,
        message="the run Admitted",
    )
    startup = get_json(kube, "mdr", QUEUED, "-n", ns)["status"]["startup"]
    assert startup["admissionWaitSeconds"] >= 0
    # Trainer made the JobSet from the runtime, owned by the TrainJob; JobSet's webhook
    # defaulted and admitted it, and its controller made one indexed Job of two pods.
    jobset = eventually(
        lambda: get_or_none(kube, "jobset", QUEUED, "-n", ns), timeout=60, message="the JobSet"
    )
    (owner,) = jobset["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("TrainJob", QUEUED)
    (replicated,) = jobset["spec"]["replicatedJobs"]
    assert replicated["name"] == "node"
    assert replicated["template"]["spec"]["parallelism"] == 2
    jobs = eventually(
        lambda: get_json(kube, "jobs", "-n", ns, "-l", f"{JOBSET_LABEL}={QUEUED}")["items"],
        timeout=60,
        message="the JobSet's Job",
    )
    assert [j["metadata"]["name"] for j in jobs] == [f"{QUEUED}-node-0"]
    pods = scheduled_pods(kube, ns, f"{JOBSET_LABEL}={QUEUED}", completed=True)
    for pod in pods:
        assert pod["spec"].get("nodeSelector", {}).get("type") == "kwok", pod["spec"]
        (container,) = pod["spec"]["containers"]
        assert container["name"] == "node"

    # ... and, as kwok completes a Job's pods: the pods' end -> the Job -> JobSet's status ->
    # the TrainJob's (Trainer copies JobSet's Completed condition as Complete) -> the run's
    # Succeeded.
    eventually(
        lambda: run_phase(kube, ns, QUEUED) == "Succeeded", timeout=90, message="phase Succeeded"
    )
    job = get_json(kube, "trainjob", QUEUED, "-n", ns)
    assert job["spec"]["suspend"] is False
    complete = condition(job, "Complete")
    assert complete["status"] == "True" and complete["reason"] == "AllJobsCompleted", job
    (status,) = job["status"]["jobsStatus"]
    assert status["name"] == "node" and status["succeeded"] == 1, job["status"]
    patches = job["spec"].get("runtimePatches") or []
    assert [p["manager"] for p in patches] == ["kueue.x-k8s.io/manager"], patches
    run = get_json(kube, "mdr", QUEUED, "-n", ns)
    suspended = condition(run, "Suspended")
    assert suspended is not None and suspended["status"] == "False", run["status"]
    succeeded = condition(run, "Succeeded")
    assert succeeded["status"] == "True" and succeeded["reason"] == "AllJobsCompleted", run
    assert run["status"]["startTime"] and run["status"]["completionTime"], run["status"]
    # The run's pods, found by the JobSet's labels, were scheduled (the scheduler's time).
    scheduled = condition(run, "PodsScheduled")
    assert scheduled["status"] == "True", run["status"]
    assert scheduled["message"].startswith("2 pods scheduled: "), scheduled
    times = [condition(p, "PodScheduled")["lastTransitionTime"] for p in pods]
    assert scheduled["lastTransitionTime"] == max(times)
    row = kube.kubectl("get", "mdr", QUEUED, "-n", ns).stdout.splitlines()[1].split()
    assert row[:5] == [QUEUED, "Succeeded", "16", "16", "32"]
    # Never refused for good: a TrainJob create that Trainer's webhook answered before its
    # cache saw the TrainingRuntime is retried (Retrying), not a Failed run.
    assert not [e for e in run_events(kube, ns, QUEUED) if e["reason"] in ("JobRefused", "Failed")]


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
    apply_objects(kube, *claim_volumes(name), quota(0))
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
    assert run_phase(kube, name, QUOTA_RUN) == "Pending"
    assert get_or_none(kube, "trainingruntime", QUOTA_RUN, "-n", name) is not None
    assert get_or_none(kube, "trainjob", QUOTA_RUN, "-n", name) is None

    apply_objects(kube, quota(1))
    job = eventually(
        lambda: get_or_none(kube, "trainjob", QUOTA_RUN, "-n", name),
        timeout=120,  # the retry's backoff, at most a minute
        message="the TrainJob created once the quota has room",
    )
    assert job["spec"]["suspend"] is True
    eventually(
        lambda: run_phase(kube, name, QUOTA_RUN) == "Suspended", timeout=60, message="Suspended"
    )
    run = get_json(kube, "mdr", QUOTA_RUN, "-n", name)
    assert (
        condition(run, "Created")["status"] == "True"
        and run["status"]["jobUID"] == (job["metadata"]["uid"])
    )
    reasons = [e["reason"] for e in run_events(kube, name, QUOTA_RUN) if e["type"] == "Warning"]
    assert reasons.count("Retrying") == 1 and "JobRefused" not in reasons, reasons
