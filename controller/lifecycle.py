"""Where a run is in its life, from real signals: the run's lifecycle conditions. Pure.

From the pods of the run's job (:func:`pod_summary`: the scheduler's ``PodScheduled``, the
kubelet's container states), the trainer's reports of this attempt (``status.progress``) and
Kueue's Workload (:func:`admission`), each in its owner's words, never guessed: the conditions
``Admitted``, ``PodsScheduled``, ``Initialized``, ``Training``, ``Evaluating``,
``status.stage`` and ``status.startup``. Each condition, its reasons and sources:
docs/controller.md, "Where a run is: the lifecycle conditions".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from megdet.controller.conditions import condition_of, set_condition
from megdet.controller.pod_problems import JOBSET_NAME_LABEL, RUN_LABEL, pod_of_runs_job
from megdet.progress import format_time, parse_time

__all__ = [
    "ADMITTED",
    "EVALUATING",
    "INITIALIZED",
    "PODS_SCHEDULED",
    "STAGES",
    "STARTUP_PARTS",
    "TRAINING",
    "admission",
    "lifecycle_status",
    "pod_summary",
    "stage_of",
]

ADMITTED = "Admitted"
PODS_SCHEDULED = "PodsScheduled"
INITIALIZED = "Initialized"
TRAINING = "Training"
EVALUATING = "Evaluating"
#: ``status.stage`` values: the step the run is at (the phases where the job decides).
STAGES = (
    "Pending",
    "Queued",
    "Scheduling",
    "Initializing",
    "Training",
    "Evaluating",
    "Finishing",
    "Running",
    "Restarting",
    "Suspended",
    "Succeeded",
    "Failed",
    "Invalid",
)
#: Phases in which the job, not the pods or the trainer, says where the run is.
_JOB_DECIDES = ("Restarting", "Suspended", "Succeeded", "Failed", "Invalid")
#: The pod conditions kept (k8s.io/api core/v1: PodScheduled, Initialized).
_POD_CONDITIONS = ("PodScheduled", "Initialized")


def pod_summary(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the lifecycle needs of a pod, in the pod's own shape (so that
    :func:`~megdet.controller.pod_problems.pod_of_runs_job` reads it): name, owner, the
    JobSet's label, creation time, the kept conditions and the containers' states."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    keep = {k: labels[k] for k in (RUN_LABEL, JOBSET_NAME_LABEL) if k in labels}
    return {
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "creationTimestamp": meta.get("creationTimestamp"),
            "labels": keep,
            "ownerReferences": list(meta.get("ownerReferences") or []),
        },
        "status": {
            "conditions": [
                dict(c)
                for c in status.get("conditions") or []
                if isinstance(c, Mapping) and c.get("type") in _POD_CONDITIONS
            ],
            "containerStatuses": [
                {"name": c.get("name"), "state": c.get("state")}
                for c in status.get("containerStatuses") or []
                if isinstance(c, Mapping)
            ],
        },
    }


def admission(workload: Mapping[str, Any] | None) -> tuple[bool, str, str, Any] | None:
    """(admitted, Kueue's reason, Kueue's message, when) from a Workload; None without one.

    ``Admitted=True`` admits it; otherwise ``QuotaReserved`` (False while it waits for quota,
    reason ``Pending``, the message naming the missing quota) says why it waits, else
    ``Admitted`` False (quota reserved, admission checks pending)."""
    if not isinstance(workload, Mapping):
        return None
    status = workload.get("status") if isinstance(workload.get("status"), Mapping) else {}
    conds = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}
    admitted, reserved = conds.get("Admitted"), conds.get("QuotaReserved")
    if admitted is not None and admitted.get("status") == "True":
        return True, str(admitted.get("reason") or "Admitted"), _text(admitted), _when(admitted)
    why = reserved if reserved is not None and reserved.get("status") != "True" else admitted
    if why is None:
        created = (workload.get("metadata") or {}).get("creationTimestamp")
        return False, "Pending", "Kueue has not evaluated the Workload yet", created
    return False, str(why.get("reason") or "Pending"), _text(why), _when(why)


def _text(cond: Mapping[str, Any]) -> str:
    return str(cond.get("message") or "")[:1000]


def _when(cond: Mapping[str, Any]) -> Any:
    return cond.get("lastTransitionTime")


def _scheduled(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return condition_of(pod.get("status") or {}, "PodScheduled") or {}


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name"))


def _latest(times: Iterable[Any], pick: Any = max) -> str | None:
    """The latest (``pick=min``: the earliest) of ``times`` that parse."""
    parsed = [t for t in (parse_time(x) for x in times) if t is not None]
    return format_time(pick(parsed)) if parsed else None


def _seconds(start: Any, end: Any) -> int | None:
    a, b = parse_time(start), parse_time(end)
    return None if a is None or b is None else max(0, round((b - a).total_seconds()))


def _pods_view(pods: list[Mapping[str, Any]], expected: int) -> dict[str, Any]:
    """The pods' state: scheduling (a condition tuple), containers (waiting or started)."""
    pods = sorted(pods, key=_name)
    created = ((p.get("metadata") or {}).get("creationTimestamp") for p in pods)
    out: dict[str, Any] = {"created": _latest(created, min)}
    for pod in pods:
        cond = _scheduled(pod)
        if cond.get("status") == "False":
            reason = str(cond.get("reason") or "Unschedulable")
            out["scheduled"] = (False, reason, f"pod {_name(pod)}: {_text(cond)}", None)
            return out
    done = [_scheduled(p) for p in pods]
    if len(pods) < expected or not all(c.get("status") == "True" for c in done):
        ready = sum(c.get("status") == "True" for c in done)
        message = f"{ready} of {expected} pods scheduled"
        out["scheduled"] = (False, "Scheduling", message, None)
        return out
    when = _latest(c.get("lastTransitionTime") for c in done)
    names = ", ".join(_name(p) for p in pods)
    out["scheduled"] = (True, "Scheduled", f"{len(pods)} pods scheduled: {names}", when)
    out["scheduledTime"] = when
    started = []
    for pod in pods:
        name = _name(pod)
        containers = (pod.get("status") or {}).get("containerStatuses") or []
        if not containers:
            message = f"pod {name}: the kubelet has not reported its containers yet"
            out["waiting"] = ("WaitingForKubelet", message)
            return out
        for container in containers:
            state = container.get("state") or {}
            if "running" in state or "terminated" in state:
                run = state.get("running") or state.get("terminated") or {}
                started.append(run.get("startedAt"))
                continue
            waiting = state.get("waiting") or {}
            reason = str(waiting.get("reason") or "ContainerCreating")
            detail = str(waiting.get("message") or "").strip()
            text = f"pod {name}, container {container.get('name')}: {reason}"
            out["waiting"] = (reason, text + (f": {detail}" if detail else "")[:500])
            return out
    out["startedTime"] = _latest(started)
    return out


def lifecycle_status(
    run: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    workload: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """The run's status with its lifecycle conditions, ``stage`` and ``startup`` as the
    signals say (the status as it is for a run without its job, or being deleted)."""
    meta = run.get("metadata") if isinstance(run.get("metadata"), Mapping) else {}
    old = run.get("status") if isinstance(run.get("status"), Mapping) else {}
    if meta.get("deletionTimestamp") or not old.get("jobUID"):
        return dict(old)
    gen = meta.get("generation")
    conditions = [dict(c) for c in old.get("conditions") or [] if isinstance(c, Mapping)]
    have = {c.get("type"): c for c in conditions}
    phase = old.get("phase")
    progress = old.get("progress") if isinstance(old.get("progress"), Mapping) else {}
    facts: dict[str, Any] = {}

    def put(kind: str, state: bool, reason: str, message: str, when: Any = None) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, kind, state, reason, message, when or now, gen)

    if phase in ("Succeeded", "Failed"):
        for kind in (TRAINING, EVALUATING):
            if (have.get(kind) or {}).get("status") == "True":
                put(kind, False, str(phase), f"the run {str(phase).lower()}")
        return {**old, "conditions": conditions}
    verdict = admission(workload)
    if verdict is not None:
        put(ADMITTED, verdict[0], verdict[1], verdict[2], verdict[3])
        facts["queued"] = (workload.get("metadata") or {}).get("creationTimestamp")
        facts["admitted"] = verdict[3] if verdict[0] else None
    mine = [p for p in pods if pod_of_runs_job(p, run)]
    expected = old.get("nodes") if isinstance(old.get("nodes"), int) else len(mine)
    view = _pods_view(mine, max(expected, 1)) if mine else {}
    if mine:
        state, reason, message, when = view["scheduled"]
        put(PODS_SCHEDULED, state, reason, message, when)
    facts.update(view)
    if "waiting" in view:
        put(INITIALIZED, False, *view["waiting"])
    elif view.get("startedTime"):
        _trainer_conditions(put, progress, view["startedTime"], facts)
    now_on = {c.get("type"): c.get("status") for c in conditions}
    if "False" in (now_on.get(PODS_SCHEDULED), now_on.get(INITIALIZED)):
        for kind in (TRAINING, EVALUATING):  # a restarted job's pods start again
            if now_on.get(kind) == "True":
                put(kind, False, "AttemptStarting", "this attempt's pods are starting")
    out = {**old, "conditions": conditions}
    startup = _startup(old, facts)
    if startup:
        out["startup"] = startup
    return out


def _trainer_conditions(put: Any, progress: Mapping[str, Any], started: str, facts: dict) -> None:
    """Initialized, Training and Evaluating from the trainer's reports of this attempt."""
    world = parse_time(progress.get("worldTime"))
    if world is None or world < parse_time(started):  # none yet, or an earlier attempt's
        message = (
            f"the containers run since {started}; the trainer has not reported its world yet "
            "(torchrun's rendezvous, the trainer's imports)"
        )
        put(INITIALIZED, False, "Rendezvous", message)
        return
    facts.update(
        world=progress.get("worldTime"),
        loaded=progress.get("loadedTime"),
        first=progress.get("firstIterationTime"),
    )
    if not progress.get("loadedTime"):
        message = (
            f"the world formed at {progress.get('worldTime')}; building the model and the data "
            "loader, loading the checkpoint"
        )
        put(INITIALIZED, False, "LoadingDataAndModel", message, progress.get("worldTime"))
        return
    loaded = progress["loadedTime"]
    put(INITIALIZED, True, "Loaded", f"model, data and checkpoint ready at {loaded}", loaded)
    first, stage = progress.get("firstIterationTime"), progress.get("stage")
    if first:
        if stage == "finished":
            put(TRAINING, False, "TrainingFinished", "the trainer ran its last iteration")
        else:
            put(TRAINING, True, "FirstIteration", f"first iteration done at {first}", first)
    if stage == "evaluating":
        at = progress.get("iteration")
        message = f"evaluating at iteration {at}"
        put(EVALUATING, True, "Evaluating", message, progress.get("stageTime"))
    elif progress.get("evalIteration") is not None:
        ap = progress.get("ap")
        message = f"last evaluation at iteration {progress.get('evalIteration')}" + (
            f": AP {ap}" if ap is not None else ""
        )
        put(EVALUATING, False, "EvaluationDone", message, progress.get("stageTime"))


def stage_of(status: Mapping[str, Any]) -> str | None:
    """``status.stage``: the step the run is at, from its phase and conditions (None without
    a phase). The status writer sets it on every write, so it follows both."""
    phase = status.get("phase")
    if phase is None:
        return None
    conds = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, Mapping)}

    def holds(kind: str, status: str) -> bool:
        return (conds.get(kind) or {}).get("status") == status

    if phase == "Suspended" and holds(ADMITTED, "False"):
        return "Queued"  # Kueue holds the job suspended until it admits its Workload
    if phase in _JOB_DECIDES:
        return str(phase)
    if holds(ADMITTED, "False"):
        return "Queued"
    if holds(EVALUATING, "True"):
        return "Evaluating"
    if holds(TRAINING, "True"):
        return "Training"
    if (conds.get(TRAINING) or {}).get("reason") == "TrainingFinished":
        return "Finishing"  # the trainer is done; the job is not Succeeded yet
    if holds(PODS_SCHEDULED, "False"):
        return "Scheduling"
    if holds(INITIALIZED, "False") or holds(INITIALIZED, "True"):
        return "Initializing"
    return str(phase) if phase in ("Pending", "Running") else "Pending"


#: ``status.startup``'s fields and what each measures.
STARTUP_PARTS = {
    "admissionWaitSeconds": "the job's Workload created to admitted by Kueue",
    "schedulingSeconds": "the first pod created to the last one scheduled",
    "containerStartSeconds": "the last pod scheduled to its containers running (image pull, "
    "sandbox, init containers)",
    "rendezvousSeconds": "the containers running to the trainer's world formed (torchrun's "
    "rendezvous, the trainer's imports)",
    "dataModelSeconds": "the world formed to the model, data and checkpoint ready",
    "firstIterationSeconds": "model and data ready to the first iteration done",
    "totalSeconds": "the Workload (else the first pod) created to the first iteration done",
}
#: ``status.startup`` parts: (field, start fact, end fact).
PARTS = (
    ("admissionWaitSeconds", "queued", "admitted"),
    ("schedulingSeconds", "created", "scheduledTime"),
    ("containerStartSeconds", "scheduledTime", "startedTime"),
    ("rendezvousSeconds", "startedTime", "world"),
    ("dataModelSeconds", "world", "loaded"),
    ("firstIterationSeconds", "loaded", "first"),
)


def _startup(old: Mapping[str, Any], facts: Mapping[str, Any]) -> dict[str, Any]:
    """This attempt's start-up parts (kept once measured: the pods of a finished attempt go)."""
    attempt = old.get("attempt") if isinstance(old.get("attempt"), int) else 1
    before = old.get("startup") if isinstance(old.get("startup"), Mapping) else {}
    out = dict(before) if before.get("attempt") == attempt else {}
    out["attempt"] = attempt
    for name, start, end in PARTS:
        seconds = _seconds(facts.get(start), facts.get(end))
        if seconds is not None:
            out[name] = seconds
    begin = facts.get("queued") or facts.get("created")
    total = _seconds(begin, facts.get("first"))
    if total is not None:
        out["totalSeconds"] = total
    return out if len(out) > 1 else dict(before)
