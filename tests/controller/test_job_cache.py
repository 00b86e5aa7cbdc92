"""controller/job_cache.py JobCache: the job reads answered from the controller's own watch
(no request to the API server), and when they go to the API server instead."""

from __future__ import annotations

import asyncio
from typing import Any

from megdet.controller.job_cache import JOB_INDEX_PREFIX, JobCache, slim_job

INDEX_ID = JOB_INDEX_PREFIX + "pytorchjob"


def job(name: str, uid: str, version: str = "1", status: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": version,
            "ownerReferences": [{"uid": "run-uid", "controller": True}],
            "managedFields": [{"manager": "x"}],
        },
        "spec": {
            "runPolicy": {"suspend": True},
            "pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": []}}}},
        },
    }
    if status is not None:
        body["status"] = status
    return body


class FakeKopf:
    """kopf's side: an index per id (key -> store of values), fed by the indexing function."""

    def __init__(self, cache: JobCache) -> None:
        self.index: dict[Any, list[dict[str, Any]]] = {}
        self.function = cache._indexer("PyTorchJob", INDEX_ID)

    def event(self, body: dict[str, Any]) -> None:
        values = asyncio.run(self.function(body=body, **{INDEX_ID: self.index}))
        self.index.update({k: [v] for k, v in values.items()})
        assert values == {
            (body["metadata"]["namespace"], body["metadata"]["name"]): slim_job(body)
        }  # the index holds the job as the handlers read it, not its pod templates

    def deleted(self, body: dict[str, Any]) -> None:
        self.index.pop((body["metadata"]["namespace"], body["metadata"]["name"]), None)


def test_slim_job_keeps_what_the_handlers_read() -> None:
    slim = slim_job(job("a", "u1", status={"conditions": [{"type": "Created"}]}))
    assert slim["metadata"]["uid"] == "u1" and slim["metadata"]["ownerReferences"]
    assert "managedFields" not in slim["metadata"]
    assert slim["spec"] == {"runPolicy": {"suspend": True}}  # the suspend flag only
    assert slim["status"] == {"conditions": [{"type": "Created"}]}


def test_nothing_is_answered_before_the_kinds_index_is_seen() -> None:
    cache = JobCache()
    assert cache.lookup("PyTorchJob", "ns", "a") == (False, None)
    cache.created(job("a", "u1"))  # not kept: the cache does not serve the kind yet
    assert len(cache) == 0
    assert cache.lookup("TrainJob", "ns", "a") == (False, None)


def test_a_job_the_watch_never_saw_is_missing_and_one_it_saw_is_answered_from_it() -> None:
    cache = JobCache()
    kopf = FakeKopf(cache)
    kopf.event(job("a", "u1", status={"phase": "x"}))
    assert cache.serves("PyTorchJob")
    answered, found = cache.lookup("PyTorchJob", "ns", "a")
    assert answered and found == slim_job(job("a", "u1", status={"phase": "x"}))
    found["status"]["phase"] = "changed"  # a copy: the cache is not the caller's
    assert cache.lookup("PyTorchJob", "ns", "a")[1]["status"] == {"phase": "x"}
    assert cache.lookup("PyTorchJob", "ns", "b") == (True, None)
    kopf.event(job("a", "u1", version="2", status={"phase": "y"}))  # the next event
    assert cache.lookup("PyTorchJob", "ns", "a")[1]["status"] == {"phase": "y"}
    kopf.deleted(job("a", "u1"))
    assert cache.lookup("PyTorchJob", "ns", "a") == (True, None)
    assert len(cache) == 0
    kopf.event(job("n", "u9", version="abc"))  # a version that is no number: the server
    assert cache.lookup("PyTorchJob", "ns", "n") == (False, None)


def test_a_job_just_written_is_answered_from_the_answer_until_the_watch_has_it() -> None:
    now = [0.0]
    cache = JobCache(ttl=10, clock=lambda: now[0])
    kopf = FakeKopf(cache)
    kopf.event(job("other", "u0"))
    cache.created(job("a", "u1", version="5"))
    answered, found = cache.lookup("PyTorchJob", "ns", "a")
    assert answered and found["metadata"]["resourceVersion"] == "5"
    assert "pytorchReplicaSpecs" not in found["spec"]  # slim
    found["metadata"]["uid"] = "changed"  # a copy: the cache is not the caller's
    # an older incarnation of the name still in the watch is not the created one
    kopf.index[("ns", "a")] = [slim_job(job("old", "old-uid", version="3"))]
    assert cache.lookup("PyTorchJob", "ns", "a")[1]["metadata"]["uid"] == "u1"
    kopf.event(job("a", "u1", version="7", status={"s": 1}))  # delivered: the watch answers
    assert cache.lookup("PyTorchJob", "ns", "a")[1]["status"] == {"s": 1}
    assert len(cache) == 2  # "other" and "a", nothing written left over
    # A patch (a suspend) newer than the watch: its answer, until the watch delivers it.
    cache.created(job("a", "u1", version="9", status={"s": 2}))
    kopf.event(job("a", "u1", version="8", status={"s": 1}))  # an event from before it
    assert cache.lookup("PyTorchJob", "ns", "a")[1]["metadata"]["resourceVersion"] == "9"
    kopf.event(job("a", "u1", version="9", status={"s": 2}))
    assert len(cache) == 2
    cache.created(job("b", "u2"))
    now[0] = 11  # not delivered within ttl (a watch far behind, or created and deleted at
    # once): the next read asks the API server, never "no such job" from here
    assert cache.lookup("PyTorchJob", "ns", "b") == (False, None)
    assert cache.lookup("PyTorchJob", "ns", "b") == (True, None)  # once
    assert len(cache) == 2
    kopf.event(job("c", "u3"))  # the watch was faster than the create's answer
    cache.created(job("c", "u3"))
    assert cache.lookup("PyTorchJob", "ns", "c")[1]["metadata"]["uid"] == "u3"
    assert len(cache) == 3


def test_a_create_answered_409_sends_the_next_read_to_the_server() -> None:
    cache = JobCache()
    kopf = FakeKopf(cache)
    kopf.event(job("other", "u0"))
    cache.refresh("PyTorchJob", "ns", "foreign")  # a job no run controls: not in the index
    assert cache.lookup("PyTorchJob", "ns", "foreign") == (False, None)
    assert cache.lookup("PyTorchJob", "ns", "foreign") == (True, None)  # once
    # The server's answer to that read holds until the watch delivers the job.
    cache.refresh("PyTorchJob", "ns", "lost")
    assert cache.lookup("PyTorchJob", "ns", "lost") == (False, None)
    cache.created(job("lost", "u5", version="4"))
    assert cache.lookup("PyTorchJob", "ns", "lost")[1]["metadata"]["uid"] == "u5"


def test_the_written_answer_holds_until_kopf_has_stored_the_index_entry() -> None:
    # kopf calls the indexing function, then stores what it returned: a read in between must
    # still see the job this process created. (Answering "no such job" there left a run of a
    # 1,000-run burst on the real API server without any status: its reconcile saw no job to
    # report and the job's mirror leaves a job's first status to the reconcile.)
    cache = JobCache(ttl=10, clock=lambda: 0.0)
    kopf = FakeKopf(cache)
    kopf.event(job("other", "u0"))
    cache.created(job("a", "u1", version="5"))
    asyncio.run(kopf.function(body=job("a", "u1", version="6"), **{INDEX_ID: kopf.index}))
    answered, found = cache.lookup("PyTorchJob", "ns", "a")  # indexed, not yet stored
    assert answered and found["metadata"]["uid"] == "u1"
    kopf.index[("ns", "a")] = [slim_job(job("a", "u1", version="6"))]  # kopf stores it
    assert cache.lookup("PyTorchJob", "ns", "a")[1]["metadata"]["resourceVersion"] == "6"
    assert len(cache) == 2


class FakeApi:
    """The two calls of the official client's CustomObjectsApi that store answers: a read
    and a patch of a job, answering the job as the API server would (a newer version)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def get_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append("get")
        return job(args[4], "u1", version="5", status={"read": True})

    def patch_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append("patch")
        return job(args[4], "u1", version="8", status={"patched": True})


def cluster_with(cache: JobCache) -> Any:
    from megdet.controller.kubeapi import Cluster

    cluster = Cluster.__new__(Cluster)
    cluster.api, cluster.timeout, cluster.cache = FakeApi(), 1.0, cache
    return cluster


def test_a_job_the_client_read_or_patched_is_answered_from_that_answer() -> None:
    """The client's own answers feed the cache: a read from the server (after a create that
    answered 409) and a patch (a suspend) are what the next read sees, not the older state the
    watch still holds, until the watch delivers them."""
    cache = JobCache(ttl=10, clock=lambda: 0.0)
    kopf = FakeKopf(cache)
    kopf.event(job("other", "u0"))
    cluster = cluster_with(cache)
    cache.refresh("PyTorchJob", "ns", "a")  # a create of "a" answered 409
    found = cluster.get("kubeflow.org/v1", "PyTorchJob", "ns", "a")
    assert found["status"] == {"read": True} and cluster.api.calls == ["get"]
    assert cluster.get("kubeflow.org/v1", "PyTorchJob", "ns", "a")["status"] == {"read": True}
    assert cluster.api.calls == ["get"]  # the second read was the answer's
    kopf.event(job("a", "u1", version="6", status={"watched": True}))
    cluster.patch("kubeflow.org/v1", "PyTorchJob", "ns", "a", {"spec": {}})
    kopf.event(job("a", "u1", version="7", status={"watched": True}))  # before the patch
    assert cluster.get("kubeflow.org/v1", "PyTorchJob", "ns", "a")["status"] == {"patched": True}
    kopf.event(job("a", "u1", version="8", status={"patched": True}))  # the patch delivered
    assert len(cache) == 2 and cluster.api.calls == ["get", "patch"]
