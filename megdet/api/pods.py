"""`megdet render --pods`: the pods a run's job creates, as plain ``v1/Pod`` manifests.

Linters of Kubernetes manifests (kube-score, kubeconform, kube-linter, Checkov) read the
built-in workload kinds and skip custom resources, so the pod templates inside a PyTorchJob or a
TrainingRuntime are never looked at. This module writes each pod template the run's job would
turn into pods as the Pod its operator creates from it, so that those tools see what runs:

* PyTorchJob (Kubeflow training operator v1.9.4): one Pod per replica type (Master, Worker),
  named ``<job>-<type>-0`` and labelled as the operator labels it
  (``pkg/controller.v1/common/pod.go`` ``createNewPod``, ``job_controller.go`` ``GenLabels``:
  ``training.kubeflow.org/operator-name``, ``/job-name``, ``/replica-type`` in lower case,
  ``/replica-index``, and ``/job-role: master`` on the Master); its ``restartPolicy`` is the
  replica's, ``ExitCode`` becoming ``Never`` (``pkg/core/pod.go`` ``SetRestartPolicy``).
* TrainingRuntime (Kubeflow Trainer v2.3.0, through JobSet v0.12.0): one Pod per replicated
  job, named ``<job>-<replicatedJob>-0-0``, labelled with JobSet's names
  (``pkg/controllers/jobset_controller.go`` ``labelAndAnnotateObject``:
  ``jobset.sigs.k8s.io/jobset-name``, ``/replicatedjob-name``, ``/job-index``) and the Job
  controller's (``batch.kubernetes.io/job-name``, and ``/job-completion-index`` for an Indexed
  Job). The JobSet is named after the TrainJob that references the runtime (the runtime's own
  name when no TrainJob is given).

What the operators inject at run time is not added: the rendezvous env (``PET_*``,
``MASTER_ADDR``), Trainer's status-server volume, uids and hashes in labels, owner
references. The input is MegDetRuns (rendered first, as ``megdet render`` does) or objects the
run chart already rendered (``helm template charts/megdet``, ``megdet render``); of the latter,
kinds the run chart renders that hold no pod template (TrainJob, NetworkPolicy) are skipped.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from megdet.api.documents import (
    owned_objects,
    print_objects,
    read_documents,
    report_input_errors,
    report_invalid,
)
from megdet.controller.api import KIND, OWNED_KINDS

__all__ = ["RENDERED_KINDS", "PodsError", "job_pods", "run_render_pods"]

#: (apiVersion, kind) of rendered objects ``--pods`` reads: the run chart's kinds.
RENDERED_KINDS = frozenset(OWNED_KINDS)

_TRAINING = "training.kubeflow.org/"
_JOBSET = "jobset.sigs.k8s.io/"
_BATCH = "batch.kubernetes.io/"
#: The training operator's controller name for PyTorchJobs (pytorchjob_controller.go).
_PYTORCH_CONTROLLER = "pytorchjob-controller"


class PodsError(ValueError):
    """A rendered object ``--pods`` cannot turn into pods; the message names the field."""


def job_pods(objects: Iterable[Mapping[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The Pods the job among ``objects`` creates (objects without pods give none); a
    namespace the objects leave out is ``namespace``."""
    objects = list(objects)
    # A TrainJob's JobSet takes the TrainJob's name; its runtime is found by runtimeRef.
    jobset_of = {
        (obj.get("spec") or {}).get("runtimeRef", {}).get("name"): _name(obj)
        for obj in objects
        if obj.get("kind") == "TrainJob" and isinstance(obj.get("spec"), Mapping)
    }
    pods: list[dict[str, Any]] = []
    for obj in objects:
        kind = obj.get("kind")
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
        name = meta.get("name")
        if kind not in ("PyTorchJob", "TrainingRuntime"):
            continue
        if not isinstance(name, str) or not name:
            raise PodsError(f"{kind}: metadata.name is missing")
        ns = meta.get("namespace") or namespace
        if kind == "PyTorchJob":
            pods += _pytorchjob_pods(obj, name, ns)
        else:
            pods += _runtime_pods(obj, jobset_of.get(name, name), ns)
    return pods


def _get(obj: Mapping[str, Any], *path: str) -> Any:
    here: Any = obj
    for i, key in enumerate(path):
        if not isinstance(here, Mapping) or key not in here:
            where = ".".join(path[: i + 1])
            raise PodsError(f"{obj.get('kind')} {_name(obj)}: {where} is missing")
        here = here[key]
    return here


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name")) if isinstance(meta, Mapping) else "?"


def _pod(template: Any, where: str, name: str, namespace: str, labels: Mapping[str, str]) -> dict:
    if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
        raise PodsError(f"{where}: not a pod template (no spec)")
    meta = copy.deepcopy(dict(template.get("metadata") or {}))
    meta = {
        "name": name,
        "namespace": namespace,
        "labels": {**(meta.get("labels") or {}), **labels},
        **({"annotations": meta["annotations"]} if meta.get("annotations") else {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": copy.deepcopy(dict(template["spec"])),
    }


def _pytorchjob_pods(job: Mapping[str, Any], name: str, namespace: str) -> list[dict]:
    replicas = _get(job, "spec", "pytorchReplicaSpecs")
    if not isinstance(replicas, Mapping):
        raise PodsError(f"PyTorchJob {name}: spec.pytorchReplicaSpecs is not a mapping")
    pods = []
    for rtype, replica in replicas.items():
        where = f"PyTorchJob {name}: spec.pytorchReplicaSpecs.{rtype}"
        if not isinstance(replica, Mapping):
            raise PodsError(f"{where}: not a mapping")
        rt = str(rtype).lower()
        labels = {
            f"{_TRAINING}operator-name": _PYTORCH_CONTROLLER,
            f"{_TRAINING}job-name": name,
            f"{_TRAINING}replica-type": rt,
            f"{_TRAINING}replica-index": "0",
        }
        # IsMasterRole: the Master when there is one, else Worker 0.
        if rt == "master" or (rt == "worker" and "Master" not in replicas):
            labels[f"{_TRAINING}job-role"] = "master"
        pod = _pod(
            replica.get("template"), f"{where}.template", f"{name}-{rt}-0", namespace, labels
        )
        policy = replica.get("restartPolicy")
        if policy:
            pod["spec"]["restartPolicy"] = "Never" if policy == "ExitCode" else policy
        pods.append(pod)
    return pods


def _runtime_pods(runtime: Mapping[str, Any], job: str, namespace: str) -> list[dict]:
    rjobs = _get(runtime, "spec", "template", "spec", "replicatedJobs")
    if not isinstance(rjobs, list):
        raise PodsError(f"TrainingRuntime {_name(runtime)}: replicatedJobs is not a list")
    pods = []
    for i, rjob in enumerate(rjobs):
        where = f"TrainingRuntime {_name(runtime)}: spec.template.spec.replicatedJobs[{i}]"
        if not isinstance(rjob, Mapping) or not rjob.get("name"):
            raise PodsError(f"{where}: no name")
        job_spec = _get(rjob, "template", "spec")
        job_name = f"{job}-{rjob['name']}-0"
        labels = {
            f"{_JOBSET}jobset-name": job,
            f"{_JOBSET}replicatedjob-name": str(rjob["name"]),
            f"{_JOBSET}job-index": "0",
            f"{_BATCH}job-name": job_name,
        }
        if job_spec.get("completionMode") == "Indexed":
            labels[f"{_BATCH}job-completion-index"] = "0"
        template = job_spec.get("template")
        pods.append(
            _pod(template, f"{where}.template.spec.template", f"{job_name}-0", namespace, labels)
        )
    return pods


def run_render_pods(args: Any) -> int:
    """``megdet render --pods``: 0 printed, 1 an invalid MegDetRun, 2 bad input."""
    import sys

    if args.owner_uid is not None:
        print(
            "megdet render: error: --pods and --owner-uid: a pod's owner is its job, whose uid "
            "exists only in the cluster; leave --owner-uid out",
            file=sys.stderr,
        )
        return 2
    documents, errors = read_documents(args.file, also=RENDERED_KINDS)
    report_input_errors("render", errors)
    if errors:
        return 2
    if report_invalid(d for d in documents if d.body.get("kind") == KIND):
        return 1
    pods: list[dict[str, Any]] = []
    rendered: dict[str, list[dict[str, Any]]] = {}  # per file: a TrainJob and its runtime
    for doc in documents:
        if doc.body.get("kind") == KIND:
            pods += job_pods(owned_objects(doc, None), doc.namespace)
        else:
            rendered.setdefault(doc.source, []).append(doc.body)
    for source, objects in rendered.items():
        try:
            pods += job_pods(objects, "default")
        except PodsError as err:
            print(f"megdet render: error: {source}: {err}", file=sys.stderr)
            return 2
    print_objects(pods)
    return 0
