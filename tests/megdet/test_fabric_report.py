"""megdet.fabric_report: the run's fabric as progress-report metrics, and the FabricDegraded
condition the controller makes of them."""

from __future__ import annotations

import pytest

from megdet.fabric_report import (
    CONDITION,
    FABRIC_METRICS,
    REASON_AS_REQUESTED,
    REASON_NOT_NCCL,
    REASON_SOCKET_FALLBACK,
    FabricReport,
    condition,
    from_metrics,
    to_metrics,
)
from megdet.progress import METRIC_NAMES, Progress, to_request, to_status

DEGRADED = FabricReport("IB,Socket", "IB", 16, 8, "NET/IB : No device found.")


def test_the_report_goes_out_as_metrics_and_comes_back():
    metrics = to_metrics(DEGRADED)
    assert [m["name"] for m in metrics] == list(FABRIC_METRICS)
    assert from_metrics(metrics) == DEGRADED
    assert from_metrics(to_metrics(FabricReport("IB", "IB", 2))) == FabricReport("IB", "IB", 2)


def test_a_progress_report_carries_the_fabric_after_its_own_metrics_within_trainers_bounds():
    note = "NET/IB : " + "x" * 100
    p = Progress(iteration=5, max_iter=10, updated_time="2026-06-11T11:44:19Z")
    p = Progress(**{**p.__dict__, "fabric": FabricReport("Socket", "IB", 2, 2, note)})
    metrics = to_request(p)["trainerStatus"]["metrics"]
    names = [m["name"] for m in metrics]
    assert names == ["iteration", "maxIter", *FABRIC_METRICS]
    assert all(0 < len(m["value"]) <= 64 for m in metrics)
    assert from_metrics(metrics).note == note[:61] + "..."
    # status.progress has no place for it: the controller reads it apart (no problem either).
    progress, problems = to_status(to_request(p)["trainerStatus"])
    assert set(progress) <= set(METRIC_NAMES) | {"percent", "updatedTime"} and not problems


@pytest.mark.parametrize(
    "metrics",
    [
        None,
        "fabric",
        [{"name": "fabric", "value": "IB"}],  # the rest missing
        to_metrics(FabricReport("IB", "IB", 2, 3)),  # more degraded ranks than ranks
        [{"name": "fabric", "value": "IB"}, {"name": "fabricRequested", "value": "IB"},
         {"name": "fabricRanks", "value": "-2"}, {"name": "fabricDegradedRanks", "value": "0"}],
        [{"name": n, "value": 1} for n in FABRIC_METRICS],
    ],
)  # fmt: skip
def test_a_missing_or_malformed_report_is_no_report(metrics):
    assert from_metrics(metrics) is None


def test_socket_fallback_is_degraded_with_a_message_a_researcher_can_act_on():
    status, reason, message = condition(DEGRADED)
    assert (status, reason) == (True, REASON_SOCKET_FALLBACK)
    assert message.startswith("8 of 16 ranks use NCCL network Socket (TCP) although the run")
    for words in ("nccl.ib.enabled", "NCCL said: NET/IB : No device found.",
                  "nccl.ib.rdmaResourceName", "megdet doctor", "'Fabric:' log line"):  # fmt: skip
        assert words in message


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (FabricReport("IB", "IB", 16), (False, REASON_AS_REQUESTED)),
        (FabricReport("Socket", "Socket", 4), (False, REASON_AS_REQUESTED)),
        (FabricReport("AWS Libfabric", "IB", 4), (False, REASON_AS_REQUESTED)),
        (FabricReport("gloo", "any", 2), (False, REASON_NOT_NCCL)),
        (FabricReport("none", "any", 1), (False, REASON_NOT_NCCL)),
    ],
)
def test_a_fabric_as_requested_or_not_nccl_is_not_degraded(report, expected):
    assert condition(report)[:2] == expected


def test_gloo_says_it_is_not_nccl_and_unknown_says_nothing():
    assert condition(FabricReport("gloo", "any", 2))[2] == "gloo (not NCCL) on 2 ranks"
    assert condition(FabricReport("IB,unknown", "IB", 4)) is None
    assert CONDITION == "FabricDegraded"
