"""The kubelet's reasons a run's pod cannot start, picked from pod statuses."""

from __future__ import annotations

from megdet.controller.pod_problems import MESSAGE_LIMIT, STUCK_REASONS, pod_start_problem


def pod(name: str, *containers: dict, init: tuple = ()) -> dict:
    return {
        "metadata": {"name": name},
        "status": {"containerStatuses": list(containers), "initContainerStatuses": list(init)},
    }


def waiting(container: str, reason: str, message: str = "") -> dict:
    return {"name": container, "state": {"waiting": {"reason": reason, "message": message}}}


def running(container: str) -> dict:
    return {"name": container, "state": {"running": {"startedAt": "2026-12-02T00:00:00Z"}}}


def test_a_missing_image_is_named_with_the_kubelets_reason_and_message() -> None:
    msg = 'Container image "megdet.local/x:nope" is not present with pull policy of Never'
    found = pod_start_problem([pod("r-master-0", waiting("pytorch", "ErrImageNeverPull", msg))])
    assert found == (
        "ErrImageNeverPull",
        f"pod r-master-0, container pytorch: ErrImageNeverPull: {msg}",
    )


def test_containers_that_are_only_starting_are_not_a_problem() -> None:
    pods = [
        pod("r-master-0", waiting("pytorch", "ContainerCreating")),
        pod("r-worker-0", running("pytorch"), init=(waiting("init-pytorch", "PodInitializing"),)),
        {"metadata": {"name": "pending"}, "status": {}},
    ]
    assert pod_start_problem(pods) is None


def test_the_first_stuck_container_by_pod_name_and_init_first() -> None:
    pods = [
        pod("r-worker-0", waiting("pytorch", "CrashLoopBackOff")),
        pod(
            "r-master-0",
            waiting("pytorch", "ImagePullBackOff"),
            init=(waiting("init", "CreateContainerConfigError", "secret x not found"),),
        ),
    ]
    reason, message = pod_start_problem(pods)
    assert reason == "CreateContainerConfigError"
    assert message.startswith("pod r-master-0, container init:")


def test_every_listed_reason_counts_and_long_messages_are_cut() -> None:
    for reason in STUCK_REASONS:
        assert pod_start_problem([pod("p", waiting("c", reason))])[0] == reason
    _, message = pod_start_problem([pod("p", waiting("c", "ErrImagePull", "x" * 5000))])
    assert len(message) == MESSAGE_LIMIT and message.endswith("...")


def test_malformed_statuses_are_skipped() -> None:
    pods = [
        {"metadata": {"name": "a"}, "status": {"containerStatuses": ["junk", {"state": None}]}},
        {"status": {"containerStatuses": [{"state": {"waiting": "x"}}]}},
    ]
    assert pod_start_problem(pods) is None
