"""The lifecycle conditions (controller/lifecycle.py) from objects in the shapes the API server
writes them: a PyTorchJob's pods as the scheduler and the kubelet (k8s.io/kubernetes v1.36)
leave them while they are unschedulable, starting and running; a JobSet pod of a TrainJob;
Kueue v0.19's Workload while it waits for quota (its message in Kueue's own format: kueue
v0.19.0 pkg/scheduler/flavorassigner/flavorassigner.go) and once admitted; the trainer's
reports in status.progress (megdet.progress.to_status of its metrics)."""

from __future__ import annotations

import copy
from typing import Any

from megdet.controller.lifecycle import admission, lifecycle_status, pod_summary, stage_of

NOW = "2026-12-06T09:00:00Z"


def t(clock: str) -> str:
    """The time ``clock`` (HH:MM:SS) on the day of :data:`NOW`."""
    return f"2026-12-06T{clock}Z"


JOB, JOB_UID = "tiny", "6a1f0c52-8d9e-4c1b-9a57-0d3c0e2f8b11"


def run(**status) -> dict:
    base = {
        "phase": "Pending",
        "jobName": JOB,
        "jobUID": JOB_UID,
        "target": "pytorchjob",
        "nodes": 2,
        "attempt": 1,
        "conditions": [],
    }
    return {
        "metadata": {"name": JOB, "namespace": "team-a", "uid": "run-uid", "generation": 1},
        "status": base | status,
    }


def pod(name: str, *, scheduled=None, containers=None, created="2026-12-06T08:59:00Z") -> dict:
    """A pod of the run's PyTorchJob as the API server returns it (trimmed to what matters)."""
    conditions = []
    if scheduled is not None:
        conditions.append(scheduled)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "labels": {
                "app.kubernetes.io/part-of": "megdet",
                "app.kubernetes.io/instance": JOB,
                "training.kubeflow.org/job-name": JOB,
                "training.kubeflow.org/replica-type": "master",
            },
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": JOB,
                    "uid": JOB_UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "pytorch", "image": "megdet:ci"}]},
        "status": {
            "phase": "Pending",
            "qosClass": "Burstable",
            "conditions": conditions,
            **({"containerStatuses": containers} if containers is not None else {}),
        },
    }


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "lastProbeTime": None,
    "lastTransitionTime": "2026-12-06T08:59:01Z",
    "reason": "Unschedulable",
    "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes "
    "are available: 4 No preemption victims found for incoming pod.",
}


def scheduled(at: str) -> dict:
    return {
        "type": "PodScheduled",
        "status": "True",
        "lastProbeTime": None,
        "lastTransitionTime": at,
    }


CREATING = [
    {
        "name": "pytorch",
        "state": {"waiting": {"reason": "ContainerCreating"}},
        "lastState": {},
        "ready": False,
        "restartCount": 0,
        "image": "megdet:ci",
        "imageID": "",
        "started": False,
    }
]


def running(at: str) -> list[dict]:
    return [
        {
            "name": "pytorch",
            "state": {"running": {"startedAt": at}},
            "lastState": {},
            "ready": True,
            "restartCount": 0,
            "image": "megdet:ci",
            "imageID": "sha256:0f3c",
            "containerID": "containerd://9b1e",
            "started": True,
        }
    ]


def summaries(*pods: dict) -> list[dict]:
    return [pod_summary(p) for p in pods]


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


def test_an_unschedulable_pod_says_the_schedulers_reason_and_message():
    status = lifecycle_status(
        run(), summaries(pod("tiny-master-0", scheduled=UNSCHEDULABLE)), None, NOW
    )
    cond = conditions(status)["PodsScheduled"]
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert cond["message"] == "pod tiny-master-0: " + UNSCHEDULABLE["message"]
    assert stage_of(status) == "Scheduling"
    assert "Initialized" not in conditions(status)


def test_pods_scheduled_then_containers_creating_then_the_trainers_stages():
    master = pod("tiny-master-0", scheduled=scheduled("2026-12-06T08:59:02Z"), containers=CREATING)
    worker = pod(
        "tiny-worker-0",
        scheduled=scheduled("2026-12-06T08:59:03Z"),
        containers=CREATING,
        created="2026-12-06T08:59:01Z",
    )
    status = lifecycle_status(run(), summaries(master, worker), None, NOW)
    conds = conditions(status)
    assert conds["PodsScheduled"]["status"] == "True"
    # The condition's time is the scheduler's, not the controller's.
    assert conds["PodsScheduled"]["lastTransitionTime"] == "2026-12-06T08:59:03Z"
    assert conds["PodsScheduled"]["message"] == "2 pods scheduled: tiny-master-0, tiny-worker-0"
    assert (conds["Initialized"]["status"], conds["Initialized"]["reason"]) == (
        "False",
        "ContainerCreating",
    )
    message = "pod tiny-master-0, container pytorch: ContainerCreating"
    assert conds["Initialized"]["message"] == message
    assert stage_of(status) == "Initializing"
    assert status["startup"] == {"attempt": 1, "schedulingSeconds": 3}

    progress: dict[str, Any] = {}

    def step(status: dict, stage: str, at: str, **fields: Any) -> dict:
        """The lifecycle after the trainer's next report (``stage`` from ``at``, ``fields``
        added to what it reported before), the pods as they are."""
        progress.update(stage=stage, stageTime=t(at), **fields)
        before = {**run(), "status": {**status, "progress": progress}}
        return lifecycle_status(before, summaries(master, worker), None, NOW)

    # Containers run; no report yet: the world is forming.
    master["status"]["containerStatuses"] = running("2026-12-06T08:59:10Z")
    worker["status"]["containerStatuses"] = running("2026-12-06T08:59:11Z")
    status = lifecycle_status({**run(), "status": status}, summaries(master, worker), None, NOW)
    assert conditions(status)["Initialized"]["reason"] == "Rendezvous"
    assert status["startup"]["containerStartSeconds"] == 8

    # A report from an earlier attempt (its world formed before these containers) is not this
    # attempt's.
    stale = {
        "stage": "training",
        "worldTime": "2026-12-06T08:00:00Z",
        "loadedTime": "2026-12-06T08:00:05Z",
        "firstIterationTime": "2026-12-06T08:00:09Z",
    }
    again = lifecycle_status(
        {**run(), "status": {**status, "progress": stale}}, summaries(master, worker), None, NOW
    )
    assert conditions(again)["Initialized"]["reason"] == "Rendezvous"
    assert "Training" not in conditions(again)

    status = step(status, "loading", "08:59:20", worldTime=t("08:59:20"), iteration=0, maxIter=30)
    cond = conditions(status)["Initialized"]
    assert (cond["status"], cond["reason"]) == ("False", "LoadingDataAndModel")
    assert status["startup"]["rendezvousSeconds"] == 9

    status = step(
        status, "training", "08:59:31", loadedTime=t("08:59:27"), firstIterationTime=t("08:59:31")
    )
    conds = conditions(status)
    assert (conds["Initialized"]["status"], conds["Initialized"]["reason"]) == ("True", "Loaded")
    assert conds["Initialized"]["lastTransitionTime"] == "2026-12-06T08:59:27Z"
    assert (conds["Training"]["status"], conds["Training"]["lastTransitionTime"]) == (
        "True",
        "2026-12-06T08:59:31Z",
    )
    assert stage_of(status) == "Training"
    assert status["startup"] == {
        "attempt": 1,
        "schedulingSeconds": 3,
        "containerStartSeconds": 8,
        "rendezvousSeconds": 9,
        "dataModelSeconds": 7,
        "firstIterationSeconds": 4,
        "totalSeconds": 31,
    }

    status = step(status, "evaluating", "08:59:50", iteration=15)
    assert conditions(status)["Evaluating"]["status"] == "True"
    assert conditions(status)["Evaluating"]["message"] == "evaluating at iteration 15"
    assert stage_of(status) == "Evaluating"

    status = step(status, "training", "08:59:55", evalIteration=15, ap=1.5)
    cond = conditions(status)["Evaluating"]
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False",
        "EvaluationDone",
        "last evaluation at iteration 15: AP 1.5",
    )
    assert stage_of(status) == "Training"

    # The trainer ran its last iteration and evaluation; the job has not succeeded yet.
    finishing = step(status, "finished", "09:00:10")
    assert conditions(finishing)["Training"]["reason"] == "TrainingFinished"
    assert stage_of(finishing) == "Finishing"

    # The job succeeded: training is over; the pods' conditions stand as they were.
    done = lifecycle_status({**run(), "status": {**status, "phase": "Succeeded"}}, [], None, NOW)
    assert conditions(done)["Training"]["reason"] == "Succeeded"
    assert conditions(done)["PodsScheduled"] == conditions(status)["PodsScheduled"]
    assert done["startup"] == status["startup"]
    assert stage_of(done) == "Succeeded"


def test_a_restarted_jobs_new_pods_end_training_until_this_attempt_trains():
    """The job restarted its pods (Running again): the old attempt's report does not count,
    Training turns False and the stage is Initializing until this attempt's first iteration."""
    training = {
        "type": "Training",
        "status": "True",
        "reason": "FirstIteration",
        "message": "first iteration done",
        "lastTransitionTime": "2026-12-06T08:00:09Z",
    }
    old = run(
        phase="Running",
        conditions=[training],
        progress={
            "stage": "training",
            "worldTime": "2026-12-06T08:00:00Z",
            "loadedTime": "2026-12-06T08:00:05Z",
            "firstIterationTime": "2026-12-06T08:00:09Z",
        },
    )
    master = pod(
        "tiny-master-0",
        scheduled=scheduled("2026-12-06T08:59:02Z"),
        containers=running("2026-12-06T08:59:10Z"),
    )
    worker = pod(
        "tiny-worker-0",
        scheduled=scheduled("2026-12-06T08:59:03Z"),
        containers=running("2026-12-06T08:59:11Z"),
    )
    status = lifecycle_status(old, summaries(master, worker), None, NOW)
    conds = conditions(status)
    assert conds["Initialized"]["reason"] == "Rendezvous"
    assert (conds["Training"]["status"], conds["Training"]["reason"]) == (
        "False",
        "AttemptStarting",
    )
    assert stage_of(status) == "Initializing"


def test_pods_of_another_job_count_for_nothing():
    other = pod("tiny-master-0", scheduled=UNSCHEDULABLE)
    other["metadata"]["ownerReferences"][0]["uid"] = "someone-elses"
    status = lifecycle_status(run(), summaries(other), None, NOW)
    assert status["conditions"] == [] and "startup" not in status


def test_a_trainjobs_pod_is_found_by_the_jobset_labels():
    jobset_pod = pod("tiny-node-0-0-x7k2p", scheduled=UNSCHEDULABLE)
    jobset_pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = JOB
    jobset_pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": f"{JOB}-node-0",
            "uid": "j",
            "controller": True,
            "blockOwnerDeletion": True,
        },
    ]
    status = lifecycle_status(run(target="trainjob"), summaries(jobset_pod), None, NOW)
    assert conditions(status)["PodsScheduled"]["reason"] == "Unschedulable"


#: A Workload of Kueue v0.19 waiting for quota, as its controller writes it.
PENDING_WORKLOAD = {
    "apiVersion": "kueue.x-k8s.io/v1beta2",
    "kind": "Workload",
    "metadata": {
        "name": "trainjob-tiny-3c1f9",
        "namespace": "team-a",
        "creationTimestamp": "2026-12-06T08:58:00Z",
    },
    "spec": {"queueName": "team-a", "podSets": [{"name": "node", "count": 2}]},
    "status": {
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Pending",
                "message": "couldn't assign flavors to pod set node: insufficient quota for "
                "nvidia.com/gpu in flavor default-flavor, previously considered podsets requests "
                "(0) + current podset request (2) > maximum capacity (1)",
                "lastTransitionTime": "2026-12-06T08:58:01Z",
                "observedGeneration": 1,
            }
        ],
        "resourceRequests": [{"name": "node", "resources": {"nvidia.com/gpu": "2"}}],
    },
}


def test_a_workload_waiting_for_quota_queues_the_run_with_kueues_words():
    verdict = admission(PENDING_WORKLOAD)
    assert verdict[:2] == (False, "Pending")
    assert "insufficient quota for nvidia.com/gpu" in verdict[2]
    status = lifecycle_status(run(phase="Suspended"), [], PENDING_WORKLOAD, NOW)
    cond = conditions(status)["Admitted"]
    assert (cond["status"], cond["reason"]) == ("False", "Pending")
    assert cond["message"] == PENDING_WORKLOAD["status"]["conditions"][0]["message"]
    assert stage_of(status) == "Queued"

    admitted = copy.deepcopy(PENDING_WORKLOAD)
    admitted["status"]["conditions"] = [
        {
            "type": "QuotaReserved",
            "status": "True",
            "reason": "QuotaReserved",
            "message": "Quota reserved in ClusterQueue gpus",
            "lastTransitionTime": "2026-12-06T08:58:40Z",
        },
        {
            "type": "Admitted",
            "status": "True",
            "reason": "Admitted",
            "message": "The workload is admitted",
            "lastTransitionTime": "2026-12-06T08:58:40Z",
        },
    ]
    status = lifecycle_status({**run(), "status": status}, [], admitted, NOW)
    cond = conditions(status)["Admitted"]
    assert (cond["status"], cond["reason"], cond["lastTransitionTime"]) == (
        "True",
        "Admitted",
        "2026-12-06T08:58:40Z",
    )
    assert status["startup"]["admissionWaitSeconds"] == 40
    assert admission(None) is None


def test_a_queued_runs_admitted_time_is_when_it_began_to_wait_and_kueues_later_words_follow():
    # The controller can see the Workload before Kueue evaluates it (the e2e queued run did):
    # the run waits from the Workload's creation. Kueue's verdict then changes the message, not
    # the time: lastTransitionTime moves only when the status flips, however often Kueue writes
    # QuotaReserved=False again with a newer time.
    fresh = {**copy.deepcopy(PENDING_WORKLOAD), "status": {}}
    status = lifecycle_status(run(phase="Suspended"), [], fresh, NOW)
    cond = conditions(status)["Admitted"]
    assert (cond["status"], cond["reason"], cond["lastTransitionTime"]) == (
        "False",
        "Pending",
        "2026-12-06T08:58:00Z",
    )
    assert "not evaluated" in cond["message"]
    later = copy.deepcopy(PENDING_WORKLOAD)
    for when in ("2026-12-06T08:58:01Z", "2026-12-06T08:58:09Z"):
        later["status"]["conditions"][0]["lastTransitionTime"] = when
        status = lifecycle_status({**run(phase="Suspended"), "status": status}, [], later, NOW)
        cond = conditions(status)["Admitted"]
        assert cond["message"] == later["status"]["conditions"][0]["message"]
        assert cond["lastTransitionTime"] == "2026-12-06T08:58:00Z"
    assert stage_of(status) == "Queued"


def test_the_stage_follows_the_phase_where_the_job_decides():
    assert stage_of({"phase": "Restarting", "conditions": []}) == "Restarting"
    assert stage_of({"phase": "Invalid"}) == "Invalid"
    assert stage_of({}) is None
    assert stage_of({"phase": "Pending", "conditions": []}) == "Pending"
    # A job that runs, of which nothing more is known (no pods in the watch, no report).
    assert stage_of({"phase": "Running", "conditions": []}) == "Running"


def test_a_run_without_its_job_or_being_deleted_is_left_alone():
    bare = run()
    del bare["status"]["jobUID"]
    assert lifecycle_status(bare, [], PENDING_WORKLOAD, NOW) == bare["status"]
    deleting = run()
    deleting["metadata"]["deletionTimestamp"] = NOW
    assert lifecycle_status(deleting, [], PENDING_WORKLOAD, NOW) == deleting["status"]
