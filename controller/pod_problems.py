"""Why a run's pods do not start, in the kubelet's own words, for the run's status. Pure. Which
reasons and which pods count: docs/operations.md, "Pods that cannot start"; the handler is the
run mirror's (:mod:`megdet.controller.mirror`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: The kubelet's waiting reasons that mean "this pod will not start until something changes".
STUCK_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "ImageInspectError",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)
#: The condition a stuck pod sets False on the run (True again once no pod is stuck).
CONDITION = PODS_STARTED_CONDITION = "PodsStarted"
#: Longest message kept from the kubelet (an image reference, a registry's error text).
MESSAGE_LIMIT = 512
#: The run chart's labels on every trainer pod (charts/megdet/templates/_pod.tpl): the
#: pods' watch selects ``PART_OF`` on the server; ``RUN_LABEL`` names the run.
PART_OF = ("app.kubernetes.io/part-of", "megdet")
RUN_LABEL = "app.kubernetes.io/instance"
#: Pod phases that say its containers started (or ran and ended).
STARTED_PHASES = frozenset({"Running", "Succeeded", "Failed"})
#: The JobSet's label on its pods: the JobSet's name (a TrainJob's JobSet is named after it).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def _waiting(status: Mapping[str, Any]) -> Mapping[str, Any]:
    state = status.get("state")
    waiting = state.get("waiting") if isinstance(state, Mapping) else None
    return waiting if isinstance(waiting, Mapping) else {}


def pod_start_problem(pods: Iterable[Mapping[str, Any]]) -> tuple[str, str] | None:
    """The first stuck container of ``pods`` (by pod name, init containers first) as
    ``(reason, message)``, e.g. ``("ErrImageNeverPull", "pod r-master-0, container pytorch:
    ErrImageNeverPull: Container image ... is not present with pull policy of Never")``; None
    when no container is stuck."""
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        name = (pod.get("metadata") or {}).get("name", "?")
        status = pod.get("status") or {}
        for key in ("initContainerStatuses", "containerStatuses"):
            for container in status.get(key) or []:
                if not isinstance(container, Mapping):
                    continue
                waiting = _waiting(container)
                reason = waiting.get("reason")
                if reason not in STUCK_REASONS:
                    continue
                detail = str(waiting.get("message") or "").strip()
                text = f"pod {name}, container {container.get('name', '?')}: {reason}"
                if detail:
                    text += f": {detail}"
                if len(text) > MESSAGE_LIMIT:
                    text = text[: MESSAGE_LIMIT - 3] + "..."
                return str(reason), text
    return None


def run_of_pod(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, run name) the pod's labels name, None for a pod without them."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    namespace, run = meta.get("namespace"), labels.get(RUN_LABEL)
    if labels.get(PART_OF[0]) != PART_OF[1] or not isinstance(run, str) or not run:
        return None
    return (namespace, run) if isinstance(namespace, str) and namespace else None


def started(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's containers started (it runs, or ran and ended)."""
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    return status.get("phase") in STARTED_PHASES


def pod_of_runs_job(pod: Mapping[str, Any], run: Mapping[str, Any]) -> bool:
    """Whether ``pod`` is controlled by the job the controller created for ``run``: the
    PyTorchJob ``status.jobName`` of uid ``status.jobUID``, or a batch/v1 Job of the TrainJob's
    JobSet (named ``<job>-...``, with its JobSet's label); False before the status records a job."""
    status = run.get("status") if isinstance(run.get("status"), Mapping) else {}
    job, job_uid = status.get("jobName"), status.get("jobUID")
    if not isinstance(job, str) or not job or not job_uid:
        return False
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    refs = meta.get("ownerReferences") if isinstance(meta.get("ownerReferences"), list) else []
    owner = next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True), None)
    if owner is None:
        return False
    if status.get("target") == "trainjob":
        labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
        return (
            (owner.get("apiVersion"), owner.get("kind")) == ("batch/v1", "Job")
            and str(owner.get("name") or "").startswith(f"{job}-")
            and labels.get(JOBSET_NAME_LABEL) == job
        )
    expected = ("kubeflow.org/v1", "PyTorchJob", job, job_uid)
    return tuple(owner.get(key) for key in ("apiVersion", "kind", "name", "uid")) == expected
