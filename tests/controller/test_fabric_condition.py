"""The MegDetRun's FabricDegraded condition from the fabric in the trainer's reports: the pure
part, the conditional write (target pytorchjob, through the progress hub) and the TrainJob
mirror (target trainjob)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from test_progress_endpoint import NS, FakeAPI, report, run_obj

from megdet import progress as protocol
from megdet.controller.fabric_condition import condition_writer, trainjob_fabric, with_fabric
from megdet.controller.planning import plan_children
from megdet.controller.status import Observed, condition_of, desired_status
from megdet.fabric_report import FabricReport

T0, T1 = "2026-11-30T10:00:00Z", "2026-11-30T10:05:00Z"
DEGRADED = FabricReport("IB,Socket", "IB", 16, 8, "NET/IB : No device found.")
HEALTHY = FabricReport("IB", "IB", 16)


def _cond(conditions: list[dict[str, Any]]) -> tuple[str, str] | None:
    found = condition_of({"conditions": conditions}, "FabricDegraded")
    return None if found is None else (found["status"], found["reason"])


def test_the_condition_follows_the_report_and_keeps_the_others():
    valid = {"type": "Valid", "status": "True", "reason": "SpecValid", "message": ""}
    degraded = with_fabric([valid], DEGRADED, T0, 3)
    assert degraded[0] == valid and _cond(degraded) == ("True", "SocketFallback")
    assert "8 of 16 ranks use NCCL network Socket" in degraded[1]["message"]
    assert "NCCL said: NET/IB : No device found. Check" in degraded[1]["message"]
    healed = with_fabric(degraded, HEALTHY, T1, 4)
    assert _cond(healed) == ("False", "FabricAsRequested")
    assert healed[1]["lastTransitionTime"] == T1 and healed[1]["observedGeneration"] == 4
    # Unknown on a rank and nothing degraded: nothing said, the condition stays as it is.
    assert with_fabric(healed, FabricReport("IB,unknown", "IB", 16), T1, 4) == healed
    assert with_fabric([valid], None, T1, 4) == [valid]


class VersionedRuns:
    """Runs with a resourceVersion; a conditional patch over an older one is 409 Conflict."""

    def __init__(self, run: dict[str, Any]) -> None:
        self.run = run
        self.patches: list[tuple[dict[str, Any], str | None]] = []
        self.meddle: list[dict[str, Any]] = []  # conditions another writer sets before a patch

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.run)

    def patch(self, namespace: str, name: str, status: Any, version: str | None) -> Any:
        if self.meddle:
            self.run["status"]["conditions"].append(self.meddle.pop())
            self.run["metadata"]["resourceVersion"] = str(int(version) + 1)
        if version != self.run["metadata"]["resourceVersion"]:
            raise Conflict()
        self.patches.append((copy.deepcopy(status), version))
        self.run["status"].update(copy.deepcopy(status))
        self.run["metadata"]["resourceVersion"] = str(int(version) + 1)


class Conflict(Exception):
    status = 409


def _run() -> dict[str, Any]:
    valid = {"type": "Valid", "status": "True", "reason": "SpecValid", "message": ""}
    return {
        "metadata": {"name": "r1", "namespace": NS, "generation": 2, "resourceVersion": "7"},
        "status": {"phase": "Running", "conditions": [valid]},
    }


def test_the_write_is_conditional_and_keeps_a_condition_set_in_between():
    runs = VersionedRuns(_run())
    pods = {"type": "PodsStarted", "status": "True", "reason": "Started", "message": "ok"}
    runs.meddle.append(pods)  # the reconciler writes between our read and our patch
    write = condition_writer(runs.get, runs.patch, lambda: T0)
    assert write(NS, "r1", DEGRADED)
    types = [c["type"] for c in runs.run["status"]["conditions"]]
    assert types == ["Valid", "PodsStarted", "FabricDegraded"]  # read again, nothing lost
    assert [version for _status, version in runs.patches] == ["8"]
    assert write(NS, "r1", DEGRADED) and len(runs.patches) == 1  # holds it: no write


def test_a_run_that_is_gone_or_an_error_is_said():
    write = condition_writer(lambda ns, name: None, None, lambda: T0)
    assert write(NS, "r1", DEGRADED) is False

    class Refused(Exception):
        status = 422

    def refuse(*args: Any) -> None:
        raise Refused("no")

    with pytest.raises(Refused):
        condition_writer(VersionedRuns(_run()).get, refuse, lambda: T0)(NS, "r1", DEGRADED)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_hub_writes_the_condition_when_the_fabric_changes_and_retries_after_an_interval():
    clock, api, written = Clock(), FakeAPI({(NS, "r1"): run_obj("r1")}), []
    fail = [True]

    def write(namespace: str, name: str, fabric: FabricReport) -> bool:
        if fail[0]:
            fail[0] = False
            raise RuntimeError("API server unavailable")
        written.append(fabric)
        return True

    hub = api.hub(interval=30, clock=clock, write_fabric=write)  # fmt: skip
    progress, _ = protocol.to_status(report(10)["trainerStatus"])
    hub.report(NS, "r1", progress, DEGRADED)
    hub.flush()  # the write failed: tried again after a full interval, not at once
    clock.now += 1
    hub.flush()
    assert written == []
    clock.now += 30
    hub.flush()
    assert written == [DEGRADED]
    for _ in range(3):  # the same fabric in every report: written once
        clock.now += 31
        hub.report(NS, "r1", progress)  # a report without it keeps the last one
        hub.report(NS, "r1", progress, DEGRADED)
        hub.flush()
    assert written == [DEGRADED]
    hub.report(NS, "r1", progress, HEALTHY)  # a restart on fixed nodes
    hub.flush()
    assert written == [DEGRADED, HEALTHY]


def test_a_trainjob_runs_condition_comes_from_trainers_stored_report():
    run = {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {"name": "r", "namespace": NS, "uid": "u-1", "generation": 2},
        "spec": {"gpus": 16, "target": "trainjob"},
    }
    job = plan_children(run).job
    job["metadata"]["uid"] = "job-1"
    progress = protocol.Progress(iteration=5, max_iter=10, updated_time=T0, fabric=DEGRADED)
    trainer = protocol.to_request(progress)["trainerStatus"]
    running = [{"name": "node", "ready": 2, "succeeded": 0, "failed": 0, "active": 2,
                "suspended": 0}]  # fmt: skip
    job["status"] = {"jobsStatus": running, "trainerStatus": trainer}
    assert trainjob_fabric(job) == DEGRADED
    old = {"phase": "Running", "jobUID": "job-1", "conditions": []}
    status = desired_status({**run, "status": old}, job, Observed(), T1, 2)
    assert _cond(status["conditions"]) == ("True", "SocketFallback")
    assert status["progress"]["iteration"] == 5
    del job["status"]["trainerStatus"]  # nothing reported yet: nothing said
    assert condition_of(desired_status({**run, "status": old}, job, Observed(), T1, 2),
                        "FabricDegraded") is None  # fmt: skip
