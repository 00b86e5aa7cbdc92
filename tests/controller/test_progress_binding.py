"""The progress endpoint's token decision: a token is the run's only when its
audience names the run's uid and the pod it is bound to is a pod of the job this controller
created for the run, live in the pods' watch. A fake issuer and namespace
(tests/controller/progress_fakes.py); the real API server's tokens are in
tests/e2e/test_e2e_progress_ha.py."""

from __future__ import annotations

import pytest
from progress_fakes import (
    NS,
    Clock,
    FakeIssuer,
    FakeNamespace,
    job,
    job_uid,
    pod,
    pod_uid,
    run_uid,
)

from megdet import progress as protocol
from megdet.controller.progress_auth import RunAuthenticator
from megdet.controller.progress_binding import Directory, RunRef, pod_ref, run_ref


@pytest.fixture()
def world():
    """One run, "victim", with its job and two pods; nothing else is a run."""
    ns = FakeNamespace(every_run=False)
    ns.runs[NS, "victim"] = RunRef("victim", run_uid("victim"), "victim", job_uid("victim"))
    ns.jobs[NS, "victim"] = job("victim")
    for name in ("victim-master-0", "victim-worker-0"):
        ns.pods[NS, name] = pod(name, "victim")
    review = FakeIssuer()
    clock = Clock()
    auth = ns.authenticator(review, clock)
    return ns, review, auth, clock


def check(auth: RunAuthenticator, token: str, run: str = "victim") -> tuple[int, str]:
    verdict = auth.check(f"Bearer {token}", NS, run)
    return verdict.status, verdict.reason


def test_the_runs_own_pods_are_allowed(world) -> None:
    _ns, review, auth, _clock = world
    assert check(auth, review.mint("master", "victim", pod="victim-master-0"))[0] == 200
    assert check(auth, review.mint("worker", "victim", pod="victim-worker-0"))[0] == 200


def test_a_pod_named_as_the_runs_but_not_of_its_job_is_refused(world) -> None:
    """Anyone who may create pods can name one victim-worker-999 and give it a projected token
    for the victim's audience: the name is no proof, the pod's controller is."""
    ns, review, auth, _clock = world
    ns.pods[NS, "victim-worker-999"] = {
        "metadata": {"name": "victim-worker-999", "namespace": NS, "uid": pod_uid("x")}
    }
    token = review.mint("t999", "victim", pod="victim-worker-999", bound_uid=pod_uid("x"))
    status, reason = check(auth, token)
    assert status == 403 and "not one of job victim's pods" in reason
    # A pod under a name the job has (its worker deleted first), controlled by nothing.
    ns.pods[NS, "victim-worker-0"] = {
        "metadata": {"name": "victim-worker-0", "namespace": NS, "uid": pod_uid("y")}
    }
    token = review.mint("t0", "victim", pod="victim-worker-0", bound_uid=pod_uid("y"))
    status, reason = check(auth, token)
    assert status == 403 and "not controlled by the run's PyTorchJob victim" in reason
    ns.pods[NS, "victim-worker-0"] = pod("victim-worker-0", "victim")
    # Controlled by a job of the same name that is not the one the controller created.
    ns.pods[NS, "victim-master-0"] = pod("victim-master-0", "victim", owner_uid="forged-job",
                                         uid="m7")  # fmt: skip
    token = review.mint("t7", "victim", pod="victim-master-0", bound_uid="m7")
    assert check(auth, token)[0] == 403
    # Controlled by another kind of object of the same name and uid.
    ns.pods[NS, "victim-master-0"] = pod("victim-master-0", "victim", kind="Job", uid="m8")
    assert check(auth, review.mint("t8", "victim", pod="victim-master-0", bound_uid="m8"))[0] == 403
    # Another run's pod, minted for this run's audience.
    ns.pods[NS, "other-worker-0"] = pod("other-worker-0", "other")
    assert check(auth, review.mint("to", "victim", pod="other-worker-0"))[0] == 403


def test_a_pod_beyond_the_jobs_replicas_is_refused_even_with_the_jobs_owner_reference(world):
    """victim-worker-999 carrying a copy of the job's controller reference (name and uid are
    readable by anyone who may read the job): the job has one worker, so no such pod is its."""
    ns, review, auth, _clock = world
    ns.pods[NS, "victim-worker-999"] = pod("victim-worker-999", "victim")  # a perfect copy
    status, reason = check(auth, review.mint("t", "victim", pod="victim-worker-999"))
    assert status == 403 and "not one of job victim's pods (1 worker replicas)" in reason
    assert check(auth, review.mint("m1", "victim", pod="victim-master-1"))[0] == 403


# The training operator names a job's pods <job>-<replica type, lowercase>-<index>, the index
# written by strconv.Itoa (kubeflow/training-operator, pkg/core/utils.go GenGeneralName): one
# spelling per pod. Any other spelling of an index within the replica counts is a name no pod
# of the job will ever hold, free for a pod carrying a copied owner reference.
NOT_CANONICAL = ["victim-master-00", "victim-master-1", "victim-master-01", "victim-worker-01",
                 "victim-worker-00", "victim-worker-001", "victim-worker-+1", "victim-worker--1",
                 "victim-worker-1 ", " victim-worker-1", "victim-worker-1\n", "victim-worker-1_0",
                 "victim-worker-\u0661", "victim-worker-0x1", "victim-Worker-1", "victim-worker-",
                 "victim-launcher-0"]  # fmt: skip


@pytest.mark.parametrize("name", NOT_CANONICAL, ids=ascii)
def test_only_the_canonical_spelling_of_a_replica_index_binds(name: str) -> None:
    """A pod under a non-canonical name, carrying a perfect copy of the job's controller
    reference, is refused by its name alone: nothing is read for it."""
    ns = FakeNamespace(every_run=False)
    run = RunRef("victim", run_uid("victim"), "victim", job_uid("victim"))
    ns.jobs[NS, "victim"] = job("victim", workers=11)
    ns.pods[NS, name] = pod(name, "victim")
    reason = ns.binding().refusal(NS, run, name, pod_uid(name))
    assert reason == f"pod {NS}/{name} is not named as a pod of job victim"
    assert ns.reads == []


@pytest.mark.parametrize("name", ["victim-master-0", "victim-worker-0", "victim-worker-1",
                                  "victim-worker-9", "victim-worker-10"])  # fmt: skip
def test_the_canonical_names_within_the_replicas_bind(name: str) -> None:
    ns = FakeNamespace(every_run=False)
    run = RunRef("victim", run_uid("victim"), "victim", job_uid("victim"))
    ns.jobs[NS, "victim"] = job("victim", workers=11)
    ns.pods[NS, name] = pod(name, "victim")
    assert ns.binding().refusal(NS, run, name, pod_uid(name)) is None


def test_the_pod_must_be_the_one_the_token_is_bound_to(world) -> None:
    """A pod replaced under the same name (a new uid) is not the token's pod."""
    _ns, review, auth, _clock = world
    token = review.mint("old", "victim", pod="victim-worker-0", bound_uid="uid-of-a-gone-pod")
    status, reason = check(auth, token)
    assert status == 403 and "uid-of-a-gone-pod is not there" in reason
    assert check(auth, review.mint("no-uid", "victim", bound_uid=""))[0] == 403


def test_a_run_created_again_refuses_the_old_runs_tokens(world) -> None:
    ns, review, auth, _clock = world
    old = review.mint("old-run", "victim")
    assert check(auth, old)[0] == 200
    # The run is deleted and created again under the same name: a new uid and a new job.
    ns.runs[NS, "victim"] = RunRef("victim", "uid-victim-2", "victim", "job-uid-victim-2")
    ns.jobs[NS, "victim"] = job("victim", uid="job-uid-victim-2", owner="uid-victim-2")
    ns.pods[NS, "victim-worker-0"] = pod("victim-worker-0", "victim", uid="pod-2",
                                         owner_uid="job-uid-victim-2")  # fmt: skip
    status, reason = check(auth, old)
    assert status == 403 and "status/uid-victim-2" in reason  # the new run's audience
    new = review.mint("new-run", "victim", uid="uid-victim-2", bound_uid="pod-2")
    assert check(auth, new)[0] == 200
    assert protocol.run_audience(NS, "victim", "uid-victim-2").endswith("/status/uid-victim-2")


def test_an_unknown_run_costs_no_key_read_and_no_lookup(world) -> None:
    ns, review, auth, _clock = world
    token = review.mint("ghost", "ghost", pod="ghost-worker-0")
    for _ in range(3):
        assert check(auth, token, run="ghost")[0] == 403
    assert review.fetches == [] and ns.reads == []


def test_reports_cost_no_api_call_but_the_keys_once_and_the_job_once_a_while(world) -> None:
    """The kubelet rotates the projected token: each new token is verified with the keys read
    at the first one, its pod looked up in the watch; the job is read once per ttl."""
    ns, review, auth, clock = world
    for i in range(5):
        assert check(auth, review.mint(f"rotated-{i}", "victim"))[0] == 200
    assert len(review.fetches) == 2  # the discovery document and the JWKS, once
    assert [r for r in ns.reads if r[0] == "job"] == [("job", NS, "victim")]
    clock.now += 301  # past the job's time: read again
    assert check(auth, review.mint("later", "victim"))[0] == 200
    assert len([r for r in ns.reads if r[0] == "job"]) == 2 and len(review.fetches) == 2


def test_a_run_without_job_uid_takes_the_job_it_controls(world) -> None:
    """A run from before status.jobUID: the job of status.jobName whose controller reference
    is the run's uid (read once), not a job someone else made under that name."""
    ns, review, auth, _clock = world
    ns.runs[NS, "victim"] = RunRef("victim", run_uid("victim"), "victim", "")
    assert check(auth, review.mint("a", "victim"))[0] == 200
    assert check(auth, review.mint("b", "victim", pod="victim-master-0"))[0] == 200
    assert [r for r in ns.reads if r[0] == "job"] == [("job", NS, "victim")]
    ns.runs[NS, "forged"] = RunRef("forged", run_uid("forged"), "forged", "")
    ns.jobs[NS, "forged"] = job("forged", owner="someone-else")
    ns.pods[NS, "forged-worker-0"] = pod("forged-worker-0", "forged")
    status, reason = check(auth, review.mint("f", "forged"), run="forged")
    assert status == 403 and "has no job forged of its own" in reason


def test_a_read_that_fails_is_500_and_not_cached(world) -> None:
    ns, review, auth, _clock = world

    def broken(namespace: str, name: str):
        raise OSError("connection refused")

    auth.binding.read_job = broken
    token = review.mint("t", "victim")
    assert check(auth, token)[0] == 500
    auth.binding.read_job = ns.read_job
    assert check(auth, token)[0] == 200


def test_run_directory_follows_the_watch() -> None:
    runs = Directory(run_ref)
    body = {
        "metadata": {"namespace": NS, "name": "r", "uid": "u1"},
        "spec": {"gpus": 8},
        "status": {"jobName": "r", "jobUID": "j1"},
    }
    runs.note(body)
    assert runs.get(NS, "r") == RunRef("r", "u1", "r", "j1")
    runs.note({**body, "status": {}})
    assert runs.get(NS, "r") == RunRef("r", "u1", "", "")
    assert runs.get(NS, "r").job == "r"
    # Created again: the new uid replaces the old; a late DELETED of the old one is ignored.
    runs.note({**body, "metadata": {**body["metadata"], "uid": "u2"}})
    runs.note(body, deleted=True)
    assert runs.get(NS, "r").uid == "u2"
    runs.note({**body, "metadata": {**body["metadata"], "uid": "u2"}}, deleted=True)
    assert runs.get(NS, "r") is None
    # target trainjob: Trainer's status server serves its pods, not this endpoint.
    runs.note({**body, "spec": {"target": "trainjob"}})
    assert runs.get(NS, "r") is None and len(runs) == 0
    runs.note({"metadata": {"name": "no-uid", "namespace": NS}})
    assert len(runs) == 0
    # A list after a watch ended (410 Gone): what it lacks was deleted meanwhile, in the listed
    # namespace only; what the run holds (its version, progress) is what the write starts from.
    other = {**body, "metadata": {**body["metadata"], "namespace": "other"}}
    runs.note(body)
    runs.note(other)
    listed = {**body, "metadata": {**body["metadata"], "name": "s", "resourceVersion": "7"},
              "status": {"progress": {"iteration": 3}}}  # fmt: skip
    runs.relist([listed], NS)
    assert runs.get(NS, "r") is None and runs.get("other", "r") is not None
    assert (runs.get(NS, "s").version, runs.get(NS, "s").progress) == ("7", {"iteration": 3})


def test_pod_directory_follows_the_watch() -> None:
    """A pod's token binds while the pod is live with the token's uid: a deleted pod's token
    stops working when the watch says so; a late DELETED of a replaced pod changes nothing."""
    pods = Directory(pod_ref)
    first = pod("victim-worker-0", "victim", uid="p1")
    pods.note(first)
    owner = ("PyTorchJob", "kubeflow.org/v1", "victim", job_uid("victim"))
    assert pods.owner(NS, "victim-worker-0", "p1") == owner
    assert pods.owner(NS, "victim-worker-0", "p2") is None  # another pod's uid
    pods.note(pod("victim-worker-0", "victim", uid="p2"))  # replaced under the same name
    pods.note(first, deleted=True)  # the old one's late DELETED
    assert pods.owner(NS, "victim-worker-0", "p2") == owner and len(pods) == 1
    pods.note(pod("victim-worker-0", "victim", uid="p2"), deleted=True)
    assert pods.owner(NS, "victim-worker-0", "p2") is None and len(pods) == 0
    pods.note({"metadata": {"name": "no-uid", "namespace": NS}})
    assert len(pods) == 0


def test_a_deleted_pods_token_is_refused(world) -> None:
    """Nothing is cached per token: the pod's deletion takes effect at the next report."""
    ns, review, auth, _clock = world
    token = review.mint("w", "victim")
    assert check(auth, token)[0] == 200
    del ns.pods[NS, "victim-worker-0"]
    status, reason = check(auth, token)
    assert status == 403 and "is not there" in reason
