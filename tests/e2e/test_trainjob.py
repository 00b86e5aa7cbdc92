"""What only the TrainJob target has, on the real control plane: a run with `kueue.queueName`
that Kueue v0.19.0 holds suspended until its ClusterQueue has the GPUs, then resumes through the
whole chain of Kubeflow Trainer v2.3.0 and JobSet v0.12.0 (both webhooks served with the
project's certificates) to Succeeded; a quota refusal that heals; an elastic run resized live,
and a run preempted by Kueue and admitted again (docs/elastic.md). The checks both targets
share (an owned job, bound pods, the launch env, `restricted`) are in test_run_targets.py.

The chain: the controller creates the run's TrainingRuntime and TrainJob (Trainer's webhooks
admit both), Trainer makes a JobSet (JobSet's webhooks admit it), JobSet makes the Job, the Job
controller the pods, the scheduler binds each 8-GPU pod to a node with 8 GPUs free, and the
TrainJob's status travels back up into the MegDetRun. kwok's stages complete the pods a Job owns
at once, so on this cluster a TrainJob run ends Succeeded seconds after its pods start."""

from __future__ import annotations

import json

import pytest
import yaml
from e2e_helpers import (
    apply_objects,
    claim_volumes,
    condition,
    eventually,
    get_json,
    get_or_none,
    helm,
    mdr,
    namespace,
    pods_of,
    preemptor,
    resolve_env,
    run_namespace,
    run_phase,
)
from test_run_targets import JOBSET_LABEL, scheduled_pods

from megdet.progress import parse_time

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


def cluster_queue(gpus: int, name: str = CLUSTER_QUEUE, flavor: str = FLAVOR, **spec) -> dict:
    """A ClusterQueue of ``gpus`` GPUs in one flavor (``spec``: more of its spec)."""
    quotas = {"cpu": "1k", "memory": "64Ti", "nvidia.com/gpu": str(gpus)}
    resources = [{"name": k, "nominalQuota": v} for k, v in quotas.items()]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": list(quotas),
                    "flavors": [{"name": flavor, "resources": resources}],
                }
            ],
            **spec,
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
    # Workload's QuotaReserved reason and message, and the Stage column says Queued. Its
    # lastTransitionTime is when it became False and moves only when its status flips
    # (controller/conditions.py, the Kubernetes convention): the Workload's creation when the
    # controller saw the Workload before Kueue evaluated it ("Kueue has not evaluated the
    # Workload yet"), else the time of Kueue's first verdict; Kueue may write QuotaReserved
    # again later with the same message and a newer time, which the run does not take.
    def mirrored() -> tuple[dict, dict, dict] | None:
        workload = workload_of(kube, ns, QUEUED)
        reserved = condition(workload, "QuotaReserved")
        admitted = condition(get_json(kube, "mdr", QUEUED, "-n", ns), "Admitted")
        if reserved and admitted and admitted["message"] == reserved["message"]:
            return admitted, reserved, workload
        return None

    admitted, reserved, workload = eventually(
        mirrored, timeout=30, message="the run's Admitted condition with Kueue's message"
    )
    since = parse_time(admitted["lastTransitionTime"])
    created = parse_time(workload["metadata"]["creationTimestamp"])
    assert created <= since <= parse_time(reserved["lastTransitionTime"]), (admitted, reserved)
    assert (admitted["status"], admitted["reason"]) == ("False", reserved["reason"])
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
    # Both are the quota admission's refusals that heal: "status unknown" while its cache has
    # not seen the quota's usage yet (seen on a loaded machine), then "exceeded". Before them,
    # Trainer's webhook may refuse once more for its cache not holding the runtime the
    # controller has just created ("specified trainingRuntime must be created before the
    # TrainJob", seen in a fresh clone's make test): retried too.
    quota_words = ("exceeded quota: trainjobs", "status unknown for quota: trainjobs")
    created = eventually(
        lambda: (c := condition(get_or_none(kube, "mdr", QUOTA_RUN, "-n", name), "Created"))
        and c["reason"] == "Retrying"
        and any(words in c["message"] for words in quota_words)
        and c,
        timeout=120,  # a runtime-lag retry first, then the retry's backoff
        message="Created=False reason Retrying, for the quota",
    )
    assert created["status"] == "False"
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
    # One Warning per episode (controller/status_events.py): the runtime-lag refusal and the
    # quota's are one episode of Created=False reason Retrying.
    reasons = [e["reason"] for e in run_events(kube, name, QUOTA_RUN) if e["type"] == "Warning"]
    assert reasons.count("Retrying") == 1 and "JobRefused" not in reasons, reasons


CHART_NS, CHART_RUN = "trainjob-chart-retry-e2e", "chart-8"


def test_a_refused_chart_install_is_taken_over_by_helm_upgrade_install(kube, ns, tmp_path):
    """What docs/trainer-v2.md ("Creation order") tells a user whose `helm install` of a TrainJob
    run was refused (Trainer's webhook cache, or here the quota admission, deterministic): run
    `helm upgrade --install` with the same arguments. Helm takes over the failed release, the
    pre-upgrade hook makes the runtime again and the TrainJob is admitted. Held suspended."""
    name = namespace(kube, CHART_NS)
    refusing = {**quota(0), "metadata": {"name": "trainjobs", "namespace": name}}
    apply_objects(kube, *claim_volumes(name), refusing)
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump({"target": "trainjob", "runName": CHART_RUN, "gpus": 8,
                        "dataset": {"claimName": "coco"}, "output": {"claimName": "megdet-output"},
                        "runPolicy": {"suspend": True}})
    )  # fmt: skip
    args = (CHART_RUN, "charts/megdet", "-n", name, "-f", str(values))
    first = helm(kube, "install", *args, check=False)
    assert first.returncode != 0 and "quota: trainjobs" in first.stderr, first.stderr
    (release,) = json.loads(helm(kube, "list", "-a", "-n", name, "-o", "json").stdout)
    assert release["status"] == "failed"
    assert get_or_none(kube, "trainingruntime", f"{CHART_RUN}-megdet", "-n", name) is not None

    kube.kubectl("delete", "resourcequota", "trainjobs", "-n", name)
    helm(kube, "upgrade", "--install", *args)
    (release,) = json.loads(helm(kube, "list", "-a", "-n", name, "-o", "json").stdout)
    assert (release["status"], release["revision"]) == ("deployed", "2")
    job = get_json(kube, "trainjob", f"{CHART_RUN}-megdet", "-n", name)
    assert job["spec"]["suspend"] is True
    assert job["spec"]["runtimeRef"]["name"] == f"{CHART_RUN}-megdet"
    helm(kube, "uninstall", CHART_RUN, "-n", name, "--wait")


# -- Elastic: a resize and a preemption of a live run ------------------------------------------

ELASTIC_NS = "trainjob-elastic-e2e"
HELD_FLAVOR, HELD_CLUSTER_QUEUE, HELD_QUEUE = "no-nodes", "megdet-held", "held"
RESIZED, PREEMPTED, PREEMPTOR = "elastic-16", "preempted-16", "preemptor"
#: A node label no node has: Kueue's flavor puts it into the pods' nodeSelector, so they stay
#: Pending. kwok completes the pods a Job owns as soon as they run, and a run that has
#: succeeded is neither resized nor preempted: held, the run stays live for as long as the test
#: needs it, with its TrainJob, JobSet, Jobs and pods all made by the real controllers.
HOLD_LABEL = "megdet.io/e2e-no-such-node"


@pytest.fixture(scope="module")
def held_queue(kube, controller):
    """Trainer v2, JobSet and Kueue; a ClusterQueue of 16 GPUs for the namespace that preempts
    lower priorities within itself, its one flavor's nodes nowhere (:data:`HOLD_LABEL`)."""
    if kube.start_trainer_v2() + kube.start_kueue():
        controller.restart()  # kopf lists the kinds to watch once
    ns = run_namespace(kube, ELASTIC_NS)
    apply_objects(
        kube,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": HELD_FLAVOR},
            "spec": {"nodeLabels": {HOLD_LABEL: "true"}},
        },
        cluster_queue(
            16,
            HELD_CLUSTER_QUEUE,
            HELD_FLAVOR,
            namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": ns}},
            preemption={"withinClusterQueue": "LowerPriority"},
        ),
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": HELD_QUEUE, "namespace": ns},
            "spec": {"clusterQueue": HELD_CLUSTER_QUEUE},
        },
    )
    yield HELD_QUEUE
    for name in (RESIZED, PREEMPTED):
        kube.kubectl("delete", "mdr", name, "-n", ns, "--wait=false", check=False)
    kube.kubectl("delete", "clusterqueue", HELD_CLUSTER_QUEUE, "--wait=false", check=False)


def uid(obj: dict | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("uid")


def admitted_job(kube, ns: str, name: str, nodes: int) -> tuple[dict, dict, list[dict]]:
    """The run's TrainJob once Kueue has admitted it at ``nodes`` pods (its Workload, for the
    TrainJob of that uid), with the JobSet Trainer made of it and the pods of that JobSet."""

    def ready():
        job = get_or_none(kube, "trainjob", name, "-n", ns)
        if not job or job["spec"].get("suspend") or job["spec"]["trainer"]["numNodes"] != nodes:
            return None
        jobset = get_or_none(kube, "jobset", name, "-n", ns)
        if not jobset or jobset["metadata"]["ownerReferences"][0]["uid"] != uid(job):
            return None
        pods = pods_of(kube, ns, f"{JOBSET_LABEL}={name}")
        owned = [
            p
            for p in pods
            if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-uid") == uid(jobset)
        ]
        owned.sort(key=lambda p: p["metadata"]["name"])  # by completion index
        return len(owned) == nodes and len(pods) == nodes and (job, jobset, owned)

    return eventually(ready, timeout=90, message=f"{name}'s TrainJob admitted with {nodes} pods")


def launch(pod: dict) -> tuple[list[str], dict[str, str]]:
    """The pod's trainer arguments and its launch env (Trainer's PET_*, the chart's MEGDET_*)."""
    (container,) = pod["spec"]["containers"]
    env = {k: v for k, v in resolve_env(pod).items() if k.startswith(("PET_", "MEGDET_"))}
    return container["args"], env


def kueue_workload(kube, ns: str, job: dict) -> dict | None:
    items = get_json(kube, "workloads.kueue.x-k8s.io", "-n", ns)["items"]
    return next(
        (
            w
            for w in items
            if any(o["uid"] == uid(job) for o in w["metadata"].get("ownerReferences", []))
        ),
        None,
    )


def is_true(obj: dict | None, kind: str) -> dict | None:
    cond = condition(obj, kind)
    return cond if cond and cond["status"] == "True" else None


def test_an_elastic_trainjob_run_is_resized_live_through_trainer_and_jobset(
    kube, held_queue
) -> None:
    """`spec.gpus` 16 -> 8 on a live run: the controller deletes the TrainJob in the foreground
    and creates it again at 1 node; Trainer and JobSet make the new world from it, and Kueue
    admits its new Workload at the new size."""
    ns = ELASTIC_NS
    elastic = {"minGpus": 8, "maxGpus": 16}
    spec = run_spec(runName=RESIZED, elastic=elastic, kueue={"queueName": held_queue})
    apply_objects(kube, mdr(RESIZED, ns, spec))
    old, old_jobset, old_pods = admitted_job(kube, ns, RESIZED, nodes=2)
    old_args, old_env = launch(old_pods[0])
    assert old_env["PET_NNODES"] == "2"
    eventually(
        lambda: get_json(kube, "mdr", RESIZED, "-n", ns)["status"].get("jobUID") == uid(old),
        timeout=30,
        message="the first TrainJob recorded",
    )
    run = get_json(kube, "mdr", RESIZED, "-n", ns)
    assert run["status"]["phase"] not in ("Succeeded", "Failed"), run["status"]
    assert (run["status"]["attempt"], run["status"]["gpus"]) == (1, 16), run["status"]

    kube.kubectl("patch", "mdr", RESIZED, "-n", ns, "--type=merge", "-p", '{"spec":{"gpus":8}}')
    new, jobset, pods = admitted_job(kube, ns, RESIZED, nodes=1)
    # A new incarnation of everything below the run, none of the old left: the TrainJob (same
    # name, so the old one was gone first), its JobSet, Jobs and pods.
    assert uid(new) != uid(old) and uid(jobset) != uid(old_jobset)
    left = {uid(p) for p in pods_of(kube, ns, f"{JOBSET_LABEL}={RESIZED}")}
    assert not left & {uid(p) for p in old_pods}
    # What the API server holds: the runtime patched to 1 node before the TrainJob, the
    # JobSet Trainer made at 1 pod, the pod's env the world of 1 node.
    runtime = get_json(kube, "trainingruntime", RESIZED, "-n", ns)
    assert runtime["spec"]["mlPolicy"]["numNodes"] == 1
    (replicated,) = jobset["spec"]["replicatedJobs"]
    assert replicated["template"]["spec"]["parallelism"] == 1
    assert replicated["template"]["spec"]["completions"] == 1
    args, env = launch(pods[0])
    assert env["PET_NNODES"] == "1" and env["PET_NPROC_PER_NODE"] == "8", env
    # The resume: the same run folder and run id, the trainer told to keep the batch.
    assert args == old_args and env["MEGDET_RUN_ID"] == old_env["MEGDET_RUN_ID"]
    assert args[args.index("--output") + 1] == f"/output/{RESIZED}"
    assert args[args.index("MEGDET.RESIZE") + 1] == "keep-batch"
    # Kueue: the old Workload went with its TrainJob; the new one is admitted for 1 pod.
    assert kueue_workload(kube, ns, old) is None
    workload = kueue_workload(kube, ns, new)
    assert [p["count"] for p in workload["spec"]["podSets"]] == [1]
    assert is_true(workload, "Admitted")

    status = eventually(
        lambda: (s := get_json(kube, "mdr", RESIZED, "-n", ns)["status"]).get("jobUID") == uid(new)
        and s,
        timeout=30,
        message="the new TrainJob recorded",
    )
    assert (status["attempt"], status["gpus"], status["worldSize"]) == (2, 8, 8), status
    assert [(s["gpus"], s["reason"], s["jobUID"]) for s in status["segments"]] == [
        (16, "Created", uid(old)),
        (8, "Resized", uid(new)),
    ]
    assert status["globalBatch"] == 32 and not status.get("resize"), status  # kept
    resizing = condition({"status": status}, "Resizing")
    assert (resizing["status"], resizing["reason"]) == ("False", "Resized"), resizing
    reasons = [e["reason"] for e in run_events(kube, ns, RESIZED)]
    assert reasons.count("Resizing") == 1 and reasons.count("Resized") == 1, reasons
    header, row = kube.kubectl("get", "mdr", RESIZED, "-n", ns).stdout.splitlines()[:2]
    assert header.split()[2:5] == ["GPUS", "WORLD", "BATCH"]
    assert row.split()[2:5] == ["8", "8", "32"]
    kube.kubectl("delete", "mdr", RESIZED, "-n", ns)  # its 8 GPUs of quota back


def test_kueue_preempts_a_live_trainjob_run_and_admits_it_again(kube, held_queue) -> None:
    """A Workload of a higher priority takes the ClusterQueue's 16 GPUs: Kueue evicts the run's
    Workload and suspends its TrainJob, Trainer suspends the JobSet and the pods go; the run
    is Suspended and says why. Once the preemptor goes, Kueue admits the same TrainJob again
    and the pods come back with the same launch (the trainer resumes from the run folder)."""
    ns = ELASTIC_NS
    # The queue's 16 GPUs for this run alone (the resize test's run gives them back at its end).
    kube.kubectl("delete", "mdr", RESIZED, "-n", ns, "--ignore-not-found")
    apply_objects(
        kube, mdr(PREEMPTED, ns, run_spec(runName=PREEMPTED, kueue={"queueName": held_queue}))
    )
    job, _jobset, pods = admitted_job(kube, ns, PREEMPTED, nodes=2)
    before = launch(pods[0])

    apply_objects(kube, preemptor(PREEMPTOR, ns, HELD_QUEUE, 16))
    evicted = eventually(
        lambda: is_true(kueue_workload(kube, ns, job), "Evicted"), timeout=60, message="evicted"
    )
    assert evicted["reason"] == "Preempted", evicted
    eventually(
        lambda: not pods_of(kube, ns, f"{JOBSET_LABEL}={PREEMPTED}"),
        timeout=60,
        message="the run's pods gone",
    )
    eventually(
        lambda: is_true(
            get_or_none(kube, "workloads.kueue.x-k8s.io", PREEMPTOR, "-n", ns), "Admitted"
        ),
        timeout=60,
        message="the preemptor admitted",
    )
    suspended_job = get_json(kube, "trainjob", PREEMPTED, "-n", ns)
    assert suspended_job["spec"]["suspend"] is True and uid(suspended_job) == uid(job)
    assert get_json(kube, "jobset", PREEMPTED, "-n", ns)["spec"]["suspend"] is True
    # The run: Suspended, and why in Kueue's words (its Workload's QuotaReserved=False).
    run = eventually(
        lambda: (r := get_json(kube, "mdr", PREEMPTED, "-n", ns))["status"].get("phase")
        == "Suspended"
        and (c := condition(r, "Admitted"))
        and c["status"] == "False"
        and r,
        timeout=60,
        message="the run Suspended, not admitted",
    )
    assert is_true(run, "Suspended"), run["status"]
    reserved = condition(kueue_workload(kube, ns, job), "QuotaReserved")
    admitted = condition(run, "Admitted")
    assert reserved["status"] == "False", reserved
    assert admitted["reason"] == reserved["reason"], (admitted, reserved)
    assert admitted["message"], admitted

    kube.kubectl("delete", "workloads.kueue.x-k8s.io", PREEMPTOR, "-n", ns)
    again, _jobset, pods = admitted_job(kube, ns, PREEMPTED, nodes=2)
    assert uid(again) == uid(job)  # the same TrainJob, resumed by Kueue
    assert launch(pods[0]) == before  # same folder, run id and world: the trainer resumes
    status = eventually(
        lambda: (s := get_json(kube, "mdr", PREEMPTED, "-n", ns)["status"]).get("phase")
        != "Suspended"
        and s,
        timeout=60,
        message="the run no longer Suspended",
    )
    assert (c := condition({"status": status}, "Suspended")) and c["status"] == "False", status
    assert is_true({"status": status}, "Admitted"), status
    assert status["attempt"] == 1 and len(status["segments"]) == 1, status
