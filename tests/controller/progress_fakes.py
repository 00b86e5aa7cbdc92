"""Fakes for the progress endpoint's token decision (controller/progress_auth.py and
progress_binding.py): the cluster's service-account issuer (its discovery document, its JWKS,
and tokens signed as the API server signs a pod's projected token), and a namespace of runs,
jobs and pods as the training operator makes them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from megdet import progress as protocol
from megdet.controller.progress_auth import (
    DISCOVERY_PATH,
    JWKS_PATH,
    IssuerKeys,
    RunAuthenticator,
)
from megdet.controller.progress_binding import (
    JOB_API_VERSION,
    JOB_KIND,
    Directory,
    PodBinding,
    RunRef,
    pod_ref,
)

NS = "vision"
ISSUER = "https://kubernetes.default.svc.cluster.local"


class Clock:
    """A clock the test moves (``now``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run_uid(run: str) -> str:
    return f"uid-{run}"


def job_uid(run: str) -> str:
    return f"job-uid-{run}"


def pod_uid(pod: str) -> str:
    return f"pod-uid-{pod}"


#: One RSA key for the whole session (making one costs ~0.1 s).
_RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_jwk(key: Any, kid: str) -> dict[str, Any]:
    """The JWK the API server publishes for a signing key."""
    if isinstance(key, rsa.RSAPrivateKey):
        found, alg = jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()), "RS256"
    else:
        found, alg = jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()), "ES256"
    return {**json.loads(found), "kid": kid, "use": "sig", "alg": alg}


class FakeIssuer:
    """The cluster's service-account issuer as the API server serves it: its discovery document
    and JWKS (:meth:`fetch`, counted in ``fetches``), and :meth:`mint`, a token as the kubelet
    gets one for a pod (signed with the key ``kid``)."""

    def __init__(self) -> None:
        self.signing = {"k1": _RSA}
        self.published = ["k1"]
        self.fetches: list[str] = []
        self.fail = False

    def fetch(self, path: str) -> Mapping[str, Any]:
        self.fetches.append(path)
        if self.fail:
            raise OSError("connection refused")
        if path == DISCOVERY_PATH:
            # jwks_uri as --service-account-jwks-uri may set it: a host the controller need not
            # reach (the keys are read from the API server's own JWKS_PATH).
            return {"issuer": ISSUER, "jwks_uri": "https://oidc.example.com/keys"}
        if path == JWKS_PATH:
            return {"keys": [public_jwk(self.signing[k], k) for k in self.published]}
        raise OSError(f"404 {path}")

    def rotate(self, kid: str = "k2") -> None:
        """A new signing key, published next to the old one (as the API server does)."""
        self.signing[kid] = ec.generate_private_key(ec.SECP256R1())
        self.published.append(kid)

    def keys(self, clock: Callable[[], float] = time.monotonic) -> IssuerKeys:
        return IssuerKeys(self.fetch, clock=clock)

    def mint(
        self,
        label: str,
        run: str,
        namespace: str = NS,
        pod: str | None = None,
        *,
        uid: str | None = None,
        bound_uid: str | None = None,
        audience: str | None = None,
        kid: str = "k1",
        issuer: str = ISSUER,
        expires_in: int = 3600,
        not_before: int = 0,
        sa_namespace: str | None = None,
    ) -> str:
        """A token for ``run``'s audience (its uid: ``uid``, default :func:`run_uid`; or
        ``audience``) bound to ``pod`` (default ``<run>-worker-0``; "" for none) whose uid is
        ``bound_uid`` (default :func:`pod_uid`). ``label`` names it in test ids only."""
        pod = pod if pod is not None else f"{run}-worker-0"
        audience = audience or protocol.run_audience(namespace, run, uid or run_uid(run))
        sa_ns = sa_namespace or namespace
        now = int(time.time())
        bound: dict[str, Any] = {"namespace": sa_ns, "serviceaccount": {"name": "default"}}
        if pod:
            bound["pod"] = {"name": pod, "uid": pod_uid(pod) if bound_uid is None else bound_uid}
        claims = {
            "iss": issuer,
            "aud": [audience],
            "sub": f"system:serviceaccount:{sa_ns}:default",
            "exp": now + expires_in,
            "iat": now,
            "nbf": now + not_before,
            "jti": label,
            "kubernetes.io": bound,
        }
        key = self.signing[kid]
        alg = "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"
        return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid})


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
    :func:`run_uid` whose job is :func:`job` (100 workers) and whose live pods are
    ``<run>-master-0`` and ``<run>-worker-<i>`` (i < 100), each with :func:`pod_uid`; otherwise
    only what was put in. It stands for the pods' watch (:meth:`owner`, looked up in
    ``reads`` as ("pod", ...): no API call) and the job's read (("job", ...))."""

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

    def owner(self, namespace: str, name: str, uid: str) -> tuple[str, ...] | None:
        """:meth:`Directory.owner` over the pods there are."""
        self.reads.append(("pod", namespace, name))
        found = self.pods.get((namespace, name))
        if found is None and self.every_run:
            base, _, index = name.rpartition("-")
            run, _, role = base.rpartition("-")
            if role in ("master", "worker") and index.isdigit() and int(index) < 100:
                found = pod(name, run, namespace)
        if found is None:
            return None
        directory = Directory(pod_ref)
        directory.note(found)
        return directory.owner(namespace, name, uid)

    def read_job(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads.append(("job", namespace, name))
        if (namespace, name) in self.jobs or not self.every_run:
            return self.jobs.get((namespace, name))
        return job(name, namespace, workers=100)

    def binding(self, clock: Callable[[], float] | None = None) -> PodBinding:
        options = {"clock": clock} if clock is not None else {}
        return PodBinding(self.read_job, self, **options)  # type: ignore[arg-type]

    def authenticator(
        self, issuer: FakeIssuer, clock: Callable[[], float] | None = None
    ) -> RunAuthenticator:
        """The endpoint's authenticator over this namespace and ``issuer``."""
        keys = issuer.keys(clock) if clock is not None else issuer.keys()
        return RunAuthenticator(keys, self.run, self.binding(clock))
