"""The names the controller's API objects go by: one home for every group, version and kind
(the MegDetRun CRD's, the kinds a run owns and where each keeps what the controller reads).
"""

from __future__ import annotations

__all__ = [
    "DROPPED_VALUES",
    "FINALIZER",
    "GROUP",
    "JOB_KINDS",
    "KIND",
    "KIND_BY_TARGET",
    "OWNED_KINDS",
    "PLURAL",
    "RUN_API_VERSION",
    "SINGULAR",
    "SUSPEND_PATH",
    "TARGET_BY_KIND",
    "VERSION",
]

GROUP = "megdet.io"
VERSION = "v1alpha1"
KIND = "MegDetRun"
PLURAL = "megdetruns"
SINGULAR = "megdetrun"
RUN_API_VERSION = f"{GROUP}/{VERSION}"
#: The finalizer earlier controllers put on MegDetRuns (their delete handler's). Runs carry
#: none now; kopf removes this one where it finds it (controller/operator.py configure).
FINALIZER = f"{GROUP}/controller"

#: Kinds the chart renders for a run -> their plural (the API path segment).
OWNED_KINDS: dict[tuple[str, str], str] = {
    ("kubeflow.org/v1", "PyTorchJob"): "pytorchjobs",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainjobs",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainingruntimes",
    # spec.networkPolicy.enabled: the run's pods reachable only from each other and monitoring.
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
}
#: The owned kinds that are the run's job -> the ``spec.target`` that makes it (the rest of
#: OWNED_KINDS are helpers such as the TrainingRuntime).
TARGET_BY_KIND = {"PyTorchJob": "pytorchjob", "TrainJob": "trainjob"}
#: ``spec.target`` -> the job kind it makes.
KIND_BY_TARGET = {target: kind for kind, target in TARGET_BY_KIND.items()}
#: The job kinds, in the order of TARGET_BY_KIND.
JOB_KINDS = tuple(TARGET_BY_KIND)
#: Where each job kind keeps its suspend flag (PyTorchJob: runPolicy; TrainJob: spec).
SUSPEND_PATH = {"PyTorchJob": ("spec", "runPolicy", "suspend"), "TrainJob": ("spec", "suspend")}

#: Chart values that are not part of a run's spec: the controller names the job after the run;
#: whether unsafe MODEL.WEIGHTS may load, and the container's securityContext (privileged,
#: runAsUser 0, added capabilities), are the platform's to decide, not the run author's.
DROPPED_VALUES = (
    "global",
    "nameOverride",
    "fullnameOverride",
    "allowUnsafeWeights",
    "containerSecurityContext",
    # The controller's progress endpoint and CA (controller/progress.py): set per run by it.
    "progress",
)
