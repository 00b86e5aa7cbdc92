"""Why a run's pods do not start, in the kubelet's own words, for the run's status.

A PyTorchJob whose pods wait for an image they can never get stays ``Created`` (and a TrainJob
says nothing either): the job operators copy pod phases, not the reasons a container waits.
The kubelet writes those into each pod's ``status.containerStatuses[].state.waiting``; the
reasons below are the ones that do not heal by waiting for them, as the kubelet names them in
k8s.io/kubernetes v1.36.3: ``pkg/kubelet/images/types.go`` (ErrImagePull, ImagePullBackOff,
ErrImageNeverPull, InvalidImageName, ImageInspectError), ``pkg/kubelet/kuberuntime/
kuberuntime_container.go`` (CreateContainerConfigError, CreateContainerError) and
``pkg/kubelet/container/sync_result.go`` (RunContainerError, CrashLoopBackOff). A container
that is merely pulling or creating (``ContainerCreating``, ``PodInitializing``) is not a
problem, nor is one that a restart policy is about to start again.

Pure functions: the handler that reads the pods and the status that shows the result live in
the reconciler.
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
CONDITION = "PodsStarted"
#: Longest message kept from the kubelet (an image reference, a registry's error text).
MESSAGE_LIMIT = 512


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
