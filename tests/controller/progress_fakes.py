"""Fakes for the progress endpoint's token decision (controller/tokenauth.py and
progress_binding.py): a TokenReview that answers as the API server does for pod-bound tokens,
and a namespace of runs, jobs and pods as the training operator makes them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from megdet import progress as protocol
from megdet.controller.progress_binding import (
    JOB_API_VERSION,
    JOB_KIND,
    PodBinding,
    RunRef,
)
from megdet.controller.tokenauth import POD_NAME_EXTRA, POD_UID_EXTRA

NS = "vision"


def run_uid(run: str) -> str:
    return f"uid-{run}"


def job_uid(run: str) -> str:
    return f"job-uid-{run}"


def pod_uid(pod: str) -> str:
    return f"pod-uid-{pod}"


class FakeReview:
    """TokenReview as the API server answers it: a token is valid only for its own audience;
    each token names its ServiceAccount namespace and the pod (name, uid) it is bound to."""

    def __init__(self) -> None:
        # token -> (audience, namespace, pod name, pod uid)
        self.tokens: dict[str, tuple[str, str, str | None, str]] = {}
        self.calls = 0

    def mint(
        self,
        token: str,
        run: str,
        namespace: str = NS,
        pod: str | None = None,
        *,
        uid: str | None = None,
        bound_uid: str | None = None,
    ) -> str:
        """A token for ``run``'s audience (its uid: ``uid``, default :func:`run_uid`) bound to
        ``pod`` (default ``<run>-worker-0``) whose uid is ``bound_uid`` (default
        :func:`pod_uid`)."""
        pod = pod if pod is not None else f"{run}-worker-0"
        audience = protocol.run_audience(namespace, run, uid or run_uid(run))
        bound = pod_uid(pod) if bound_uid is None else bound_uid
        self.tokens[token] = (audience, namespace, pod, bound)
        return token

    def __call__(self, token: str, audiences: list[str]) -> Mapping[str, Any]:
        self.calls += 1
        found = self.tokens.get(token)
        if found is None or found[0] not in audiences:
            return {"authenticated": False, "error": "invalid bearer token"}
        audience, namespace, pod, uid = found
        extra = {POD_NAME_EXTRA: [pod]} if pod else {}
        if pod and uid:
            extra[POD_UID_EXTRA] = [uid]
        return {
            "authenticated": True,
            "audiences": [audience],
            "user": {"username": f"system:serviceaccount:{namespace}:default", "extra": extra},
        }


def job(run: str, namespace: str = NS, *, uid: str | None = None, owner: str | None = None,
        workers: int = 1) -> dict[str, Any]:  # fmt: skip
    """The PyTorchJob the controller created for ``run`` (controlled by the run): one master
    and ``workers`` workers."""
    return {
        "spec": {
            "pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": workers}}
        },
        "apiVersion": JOB_API_VERSION,
        "kind": JOB_KIND,
        "metadata": {
            "name": run,
            "namespace": namespace,
            "uid": uid or job_uid(run),
            "ownerReferences": [
                {
                    "apiVersion": "megdet.io/v1alpha1",
                    "kind": "MegDetRun",
                    "name": run,
                    "uid": owner or run_uid(run),
                    "controller": True,
                }
            ],
        },
    }


def pod(name: str, job_name: str, namespace: str = NS, *, uid: str | None = None,
        owner_uid: str | None = None, kind: str = JOB_KIND) -> dict[str, Any]:  # fmt: skip
    """A pod controlled by the job ``job_name`` (as the training operator creates it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or pod_uid(name),
            "labels": {"training.kubeflow.org/job-name": job_name},
            "ownerReferences": [
                {
                    "apiVersion": JOB_API_VERSION,
                    "kind": kind,
                    "name": job_name,
                    "uid": owner_uid or job_uid(job_name),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
    }


class FakeNamespace:
    """Runs, jobs and pods. ``every_run``: any name is a served run with uid
    :func:`run_uid` whose job is :func:`job` (100 workers) and whose pods are ``<run>-master-0``
    and ``<run>-worker-<i>`` (i < 100), each with :func:`pod_uid`; otherwise only what was put
    in."""

    def __init__(self, every_run: bool = True) -> None:
        self.every_run = every_run
        self.runs: dict[tuple[str, str], RunRef] = {}
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads: list[tuple[str, str, str]] = []

    def run(self, namespace: str, name: str) -> RunRef | None:
        if (namespace, name) in self.runs:
            return self.runs[namespace, name]
        if self.every_run:
            return RunRef(name=name, uid=run_uid(name), job_name=name, job_uid=job_uid(name))
        return None

    def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads.append(("pod", namespace, name))
        if (namespace, name) in self.pods:
            return self.pods[namespace, name]
        if self.every_run:
            base, _, index = name.rpartition("-")
            run, _, role = base.rpartition("-")
            if role in ("master", "worker") and index.isdigit() and int(index) < 100:
                return pod(name, run, namespace)
        return None

    def read_job(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads.append(("job", namespace, name))
        if (namespace, name) in self.jobs or not self.every_run:
            return self.jobs.get((namespace, name))
        return job(name, namespace, workers=100)

    def binding(self, clock: Callable[[], float] | None = None) -> PodBinding:
        options = {"clock": clock} if clock is not None else {}
        return PodBinding(self.read_pod, self.read_job, **options)

    def auth_parts(self, clock: Callable[[], float] | None = None) -> tuple[Any, PodBinding]:
        """(runs lookup, pod binding): the two arguments RunAuthenticator takes after the
        review."""
        return self.run, self.binding(clock)
