"""One writer per run's status, on the real API server: while the run's job fails and its
spec changes at the same moment, the controller's status writes (read back from the API
server's audit log, which records their bodies) are computed from the run's watch and carry the
resourceVersion they were computed from, so that one over a stale view is refused with 409
Conflict (and written again from a read of the run); each write that lands changes something,
and the phases they write only move forward.
"""

from __future__ import annotations

from e2e_helpers import (
    CONTROLLER_USER,
    eventually,
    get_json,
    run_namespace,
)
from test_faults import condition, fail_container, start_run, status

NS = "status-e2e"
RUN = "race"
#: The order a run's phase may take here (Pending and Running before the end).
ORDER = {"Pending": 0, "Running": 1, "Failed": 2}


def status_writes(kube) -> list[dict]:
    return [
        e
        for e in kube.audit_events(CONTROLLER_USER)
        if e.get("stage") == "ResponseComplete"
        and e.get("verb") == "patch"
        and (e.get("objectRef") or {}).get("resource") == "megdetruns"
        and (e.get("objectRef") or {}).get("subresource") == "status"
        and (e.get("objectRef") or {}).get("namespace") == NS
    ]


def test_the_jobs_mirror_and_a_spec_change_race_and_lose_nothing(kube, controller) -> None:
    ns = run_namespace(kube, NS)
    pods = start_run(kube, ns, RUN, restartPolicy="ExitCode")
    worker = next(p for p in pods if p["metadata"]["name"].endswith("-worker-0"))
    # The job fails (the training operator's status change wakes the job's mirror) while the
    # spec changes (a reconcile of the new generation): two writers of one status at once.
    fail_container(kube, ns, worker["metadata"]["name"], 1)
    kube.kubectl(
        "patch", "mdr", RUN, "-n", ns, "--type=merge", "-p",
        '{"spec": {"image": {"pullPolicy": "Always"}}}',
    )  # fmt: skip
    eventually(
        lambda: status(kube, ns, RUN).get("phase") == "Failed"
        and status(kube, ns, RUN).get("observedGeneration") == 2,
        timeout=90,
        message="the run Failed at generation 2",
    )
    run = get_json(kube, "mdr", RUN, "-n", ns)
    assert run["metadata"]["generation"] == 2
    for kind, expected in (("Valid", "True"), ("Created", "True"), ("Failed", "True")):
        assert (condition(kube, ns, RUN, kind) or {}).get("status") == expected, kind

    writes = eventually(
        lambda: (w := status_writes(kube)) and any(
            (x.get("requestObject") or {}).get("status", {}).get("phase") == "Failed" for x in w
        ) and w,
        timeout=30,
        message="the Failed write in the audit log",
    )  # fmt: skip
    codes = [w["responseStatus"].get("code") for w in writes]
    assert set(codes) <= {200, 409}, codes
    assert codes[-1] == 200, codes
    # A write refused with 409 was over the run's view, with its version as a precondition.
    for write, code in zip(writes, codes, strict=True):
        if code == 409:
            assert (write.get("requestObject") or {}).get("metadata", {}).get("resourceVersion")
    # The first write of the run is over its watch's view (no read of the run first).
    first = (writes[0].get("requestObject") or {}).get("metadata") or {}
    assert first.get("resourceVersion"), writes[0]
    bodies = [w.get("requestObject") or {} for w, c in zip(writes, codes, strict=True) if c == 200]
    assert all(b.get("status") for b in bodies), "a write that changes nothing"
    phases = [b["status"]["phase"] for b in bodies if "phase" in b["status"]]
    assert phases[0] in ("Pending", "Running") and phases[-1] == "Failed", phases
    assert [ORDER[p] for p in phases] == sorted(ORDER[p] for p in phases), phases
