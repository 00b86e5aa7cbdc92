"""Which replica serves progress (controller/progress_leader.py): kopf's peering rule read from
the peering object, and the active replica's pod label. Pure; the replicas against kmock are in
test_progress_ha.py, on the real API server in tests/e2e/test_e2e_progress_ha.py."""

from __future__ import annotations

import datetime

from megdet.controller.progress_leader import (
    ACTIVE_LABEL,
    PeeringLeadership,
    PodLabel,
    peer_is_active,
)

NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)


def peer(priority: int, seconds_ago: float = 1, lifetime: int = 60) -> dict:
    seen = NOW - datetime.timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


def test_kopfs_rule_a_live_peer_of_higher_or_equal_priority_pauses() -> None:
    assert peer_is_active({"me": peer(100)}, "me", 100, NOW)
    assert peer_is_active({}, "me", 100, NOW)  # not registered yet: kopf does not mind either
    assert not peer_is_active({"me": peer(100), "b": peer(200)}, "me", 100, NOW)
    # Equal priorities: kopf pauses both.
    assert not peer_is_active({"me": peer(100), "b": peer(100)}, "me", 100, NOW)
    assert peer_is_active({"me": peer(100), "b": peer(50)}, "me", 100, NOW)
    # A peer past lastseen + lifetime is dead (a replica that exits writes lifetime 0).
    assert peer_is_active({"b": peer(200, seconds_ago=61)}, "me", 100, NOW)
    assert peer_is_active({"b": peer(200, lifetime=0)}, "me", 100, NOW)
    # kopf's own format: lastseen with an offset; garbage entries are ignored.
    assert peer_is_active({"b": {"priority": "x"}, "c": None}, "me", 1, NOW)


def test_leadership_needs_every_peering_object_seen_and_allowing() -> None:
    lead = PeeringLeadership("me", 100, ["a", "b"], clock=lambda: NOW)
    assert not lead.active()  # nothing seen yet: kopf starts paused too
    lead.observe("a", {"status": {"me": peer(100)}})
    assert not lead.active()
    lead.observe("b", {"metadata": {"name": "p"}})  # no status yet: nobody else
    assert lead.active()
    lead.observe("b", {"status": {"other": peer(300)}})
    assert not lead.active()
    lead.observe("b", None)  # the peering object is gone: kopf cannot peer, stays paused
    assert not lead.active()


def test_the_pod_label_is_patched_once_per_change() -> None:
    patches: list[dict] = []
    state = {"active": False}
    label = PodLabel(patches.append, lambda: state["active"])
    label.step()  # the first look removes whatever a previous process left
    label.step()
    assert patches == [{ACTIVE_LABEL: None}]
    state["active"] = True
    label.step()
    label.step()
    assert patches[1:] == [{ACTIVE_LABEL: "active"}]
    state["active"] = False
    label.step()
    assert patches[2:] == [{ACTIVE_LABEL: None}]


def test_a_failed_label_patch_is_tried_again() -> None:
    calls: list[dict] = []

    def patch(labels: dict) -> None:
        calls.append(labels)
        if len(calls) == 1:
            raise OSError("connection refused")

    label = PodLabel(patch, lambda: True)
    label.step()
    assert label.labelled is None
    label.step()
    assert label.labelled is True and len(calls) == 2
