"""megdet_controller_startup_seconds: each part of status.startup observed once per attempt
(controller/lifecycle_watch.py, observe_startup); the running operator's path:
test_operator_lifecycle.py."""

from __future__ import annotations

from megdet.controller import metrics
from megdet.controller.lifecycle import STARTUP_PARTS
from megdet.controller.lifecycle_watch import PART_LABELS
from megdet.controller.lifecycle_watch import observe_startup as observe

NS = "ns-startup"


def count(part: str, namespace: str = NS) -> float:
    labels = {"namespace": namespace, "target": "pytorchjob", "part": part}
    return metrics.sample("megdet_controller_startup_seconds_count", labels)


def status(**startup: int) -> dict:
    return {"target": "pytorchjob", "startup": {"attempt": 1, **startup}}


def test_every_startup_field_has_a_part_label():
    assert set(PART_LABELS) == set(STARTUP_PARTS)
    assert PART_LABELS["admissionWaitSeconds"] == "admission_wait"
    assert PART_LABELS["firstIterationSeconds"] == "first_iteration"
    assert PART_LABELS["totalSeconds"] == "total"


def test_a_part_is_observed_when_first_written_and_never_on_a_rewrite():
    assert observe(NS, {}, status(admissionWaitSeconds=40)) == ["admission_wait"]
    assert count("admission_wait") == 1
    bucket = {"namespace": NS, "target": "pytorchjob", "part": "admission_wait", "le": "60.0"}
    assert metrics.sample("megdet_controller_startup_seconds_bucket", bucket) == 1
    # The same status written again (the next iteration's report): nothing observed.
    assert observe(NS, status(admissionWaitSeconds=40), status(admissionWaitSeconds=40)) == []
    # A part added: only that part.
    grown = status(admissionWaitSeconds=40, schedulingSeconds=3)
    assert observe(NS, status(admissionWaitSeconds=40), grown) == ["scheduling"]
    assert (count("admission_wait"), count("scheduling")) == (1, 1)


def test_a_new_attempt_observes_its_parts_again():
    ns = "ns-startup-attempts"
    first = {"target": "pytorchjob", "startup": {"attempt": 1, "rendezvousSeconds": 9}}
    second = {"target": "pytorchjob", "startup": {"attempt": 2, "rendezvousSeconds": 7}}
    observe(ns, {}, first)
    assert observe(ns, first, second) == ["rendezvous"]
    assert count("rendezvous", ns) == 2


def test_a_status_without_startup_observes_nothing():
    assert observe(NS, {}, {"target": "pytorchjob", "phase": "Pending"}) == []
