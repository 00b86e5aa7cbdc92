"""What a reconcile does to the run's objects on the API server (:class:`Children`): create the
job and the objects it needs, bring those that follow the spec to it, delete those it no longer
renders, patch the job's suspend. What stands in the way is a :class:`Trouble`, which the
reconciler turns into the run's status (docs/controller.md, "Reconcile").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client as k8s

from megdet.controller import metrics
from megdet.controller.api import TARGET_BY_KIND
from megdet.controller.kubeapi import (
    Backoff,
    Cluster,
    JobRefused,
    KindNotServed,
    RefusalHeals,
    api_call,
    classify_refusal,
    retry_later,
)
from megdet.controller.planning import (
    Planned,
    controlled_by,
    digest_of,
    merge_patch,
    suspend_of,
    suspend_patch,
    with_digest,
)
from megdet.controller.status import CHILD_REFUSED, RETRYING, conflict_message
from megdet.controller.status_writer import diff_touches, run_meta

__all__ = ["SYNCED_CHILDREN", "Children", "Trouble", "trouble_of"]

#: The run's objects (other than its job) that follow its spec after they are created, and the
#: spec field that renders each. Not a TrainingRuntime: Trainer reads it only to make a JobSet.
SYNCED_CHILDREN = {("networking.k8s.io/v1", "NetworkPolicy"): ("spec", "networkPolicy")}


@dataclass(frozen=True)
class Trouble:
    """Why one of the run's objects is not as its spec says: the condition's reason and
    message, and the delay of the next try (None: final until the spec changes)."""

    reason: str
    message: str
    delay: float | None


def trouble_of(
    err: KindNotServed | JobRefused | RefusalHeals, backoff: Backoff, retry: int
) -> Trouble:
    """A refused create (or update) as a :class:`Trouble`."""
    if isinstance(err, KindNotServed):
        return Trouble("JobKindNotInstalled", err.message, backoff.conflict_delay)
    if isinstance(err, RefusalHeals):
        return Trouble(RETRYING, err.message, backoff.delay(retry))
    return Trouble(CHILD_REFUSED, err.message, None)


def _meta_part(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata the controller renders for an object (labels, annotations)."""
    return {key: dict(meta.get(key) or {}) for key in ("labels", "annotations")}


class Children:
    """The API calls a reconcile makes for a run's objects, with ``cluster`` and the
    handlers' ``backoff`` (a failure worth retrying becomes kopf's ``TemporaryError``)."""

    def __init__(self, cluster: Cluster, backoff: Backoff) -> None:
        self.cluster = cluster
        self.backoff = backoff

    def conflict(self, kind: str, name: str) -> Trouble:
        """An object of the name the run needs is not the run's: never overwritten, retried."""
        return Trouble("JobNameConflict", conflict_message(kind, name), self.backoff.conflict_delay)

    def create_missing(
        self,
        run: Mapping[str, Any],
        decision: Planned,
        job: dict[str, Any] | None,
        done: bool,
        retry: int,
        fresh: bool = False,
        resync: bool = False,
    ) -> tuple[dict[str, Any] | None, list[Trouble], Trouble | None]:
        """Create what the run lacks and bring its other objects to the spec, the job last (a
        finished run, ``done``: none). Returns the job, the troubles of the other objects once
        the job exists, and the trouble that stopped the job (then the job is None or not the
        run's). ``fresh``: the run's first try (:meth:`ensure`); ``resync``: a resize, every
        other object brought to the new render first."""
        _namespace, _name, uid, generation = run_meta(run)
        wanted = decision.job
        troubles: list[Trouble] = []
        for obj in [] if done else decision.objects[1:]:
            trouble = self.ensure(obj, uid, generation, retry, fresh, resync)
            if trouble is None:
                continue
            if job is None:
                return None, [], trouble
            troubles.append(trouble)
        if job is None:
            try:
                job = self.create(wanted, generation, retry)
            except (KindNotServed, JobRefused, RefusalHeals) as err:
                return None, [], trouble_of(err, self.backoff, retry)
            if not controlled_by(job, uid):
                return job, troubles, self.conflict(wanted["kind"], wanted["metadata"]["name"])
        return job, troubles, None

    def ensure(
        self,
        obj: Mapping[str, Any],
        uid: str | None,
        generation: Any,
        retry: int,
        fresh: bool = False,
        resync: bool = False,
    ) -> Trouble | None:
        """One of the run's other objects as the spec says: created if missing, brought to
        the spec if it is of a kind that follows it (:data:`SYNCED_CHILDREN`), or the trouble.
        ``fresh``: created first and read only if the name is taken; else read first."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        synced = resync or (obj["apiVersion"], kind) in SYNCED_CHILDREN
        wanted = with_digest(obj) if synced else obj
        try:
            # create answers what holds the name when it is taken (409).
            found = self.create(wanted, generation, retry) if fresh else self.get(obj, retry)
            if found is None:
                self.create(wanted, generation, retry)
                return None
            if not controlled_by(found, uid):
                return self.conflict(kind, name)
            if wanted is not obj and digest_of(found) != digest_of(wanted):
                self.update(found, wanted, generation, retry)
        except (KindNotServed, JobRefused, RefusalHeals) as err:
            return trouble_of(err, self.backoff, retry)
        return None

    def update(
        self, found: Mapping[str, Any], wanted: Mapping[str, Any], generation: Any, retry: int
    ) -> None:
        """Merge-patch ``found`` into ``wanted``'s labels, annotations and spec, over the
        version read."""
        meta = found["metadata"]
        body = merge_patch(
            {k: found.get(k) for k in ("spec",)} | {"metadata": _meta_part(meta)},
            {k: wanted.get(k) for k in ("spec",)} | {"metadata": _meta_part(wanted["metadata"])},
        )
        body.setdefault("metadata", {})["resourceVersion"] = meta.get("resourceVersion")
        try:
            self.cluster.patch(
                found["apiVersion"], found["kind"], meta["namespace"], meta["name"], body
            )
        except Exception as err:
            if isinstance(err, k8s.ApiException):
                refusal = classify_refusal(found, err, generation, verb="update")
                if refusal is not None:
                    raise refusal from err
            retry_later(f"update {found['kind']} {meta['name']}", err, self.backoff, retry)
            raise

    def delete_unplanned(
        self, run: Mapping[str, Any], decision: Planned, diff: Any, retry: int
    ) -> None:
        """Delete the run's objects of a kind in :data:`SYNCED_CHILDREN` that its spec no
        longer renders: by the run's name, if the run controls it, only that incarnation.
        Looked for where ``diff`` (an update's) touches their field, or on a resume (None)."""
        namespace, name, uid, _generation = run_meta(run)
        planned = {(o["apiVersion"], o["kind"]) for o in decision.objects}
        for (api_version, kind), path in SYNCED_CHILDREN.items():
            if (api_version, kind) in planned or (
                diff is not None and not diff_touches(diff, path)
            ):
                continue
            found = api_call(
                f"get {kind} {name}",
                lambda a=api_version, k=kind: self.cluster.get(a, k, namespace, name),
                self.backoff,
                retry,
            )
            if found is None or not controlled_by(found, uid):
                continue
            found_uid = (found.get("metadata") or {}).get("uid")
            api_call(
                f"delete {kind} {name}",
                lambda a=api_version, k=kind, u=found_uid: self.cluster.delete(
                    a, k, namespace, name, u
                ),
                self.backoff,
                retry,
            )

    def get(self, obj: Mapping[str, Any], retry: int) -> dict[str, Any] | None:
        meta = obj["metadata"]
        return api_call(
            f"get {obj['kind']} {meta['name']}",
            lambda: self.cluster.get(
                obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]
            ),
            self.backoff,
            retry,
        )

    def create(self, obj: Mapping[str, Any], generation: Any, retry: int) -> dict[str, Any]:
        namespace, obj_name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            created = self.cluster.create(obj)
        except k8s.ApiException as err:
            if err.status == 404:  # the run's namespace exists, so the kind is what is missing
                raise KindNotServed(obj) from err
            refusal = classify_refusal(obj, err, generation)
            if refusal is not None:
                raise refusal from err
            if err.status != 409:
                retry_later(f"create {obj['kind']} {obj_name}", err, self.backoff, retry)
            # Someone (an earlier try whose answer was lost, or another object) holds the name.
            found = self.get(obj, retry)
            if found is None:
                raise kopf.TemporaryError(
                    f"{obj['kind']} {obj_name}: conflict", delay=self.backoff.delay(retry)
                ) from err
            return found
        except Exception as err:
            retry_later(f"create {obj['kind']} {obj_name}", err, self.backoff, retry)
            raise
        if obj["kind"] in TARGET_BY_KIND:
            metrics.JOBS_CREATED.labels(namespace, TARGET_BY_KIND[obj["kind"]]).inc()
        return created

    def sync_suspend(self, decision: Planned, job: dict[str, Any], retry: int) -> dict[str, Any]:
        wanted = suspend_of(decision.job)
        if suspend_of(job) == wanted:
            return job
        meta = job["metadata"]
        return api_call(
            f"suspend {job['kind']} {meta['name']}",
            lambda: self.cluster.patch(
                job["apiVersion"],
                job["kind"],
                meta["namespace"],
                meta["name"],
                suspend_patch(job["kind"], wanted),
            ),
            self.backoff,
            retry,
        )
