"""A MegDetRun's lifecycle on the real node, recorded from a watch of the run.

One pod (gpus 1) trains the tiny detector on the shapes dataset with the ``train-ci`` image,
the controller running as a pod (the real-training module's fixtures: its pods report their
progress to it). A ``kubectl get --watch`` of the run, started before the run exists, records
every version the API server sends; the test then lists each lifecycle condition the run
passed through (type, status, reason) in the order the watch delivered them, with their
``lastTransitionTime``, and requires the path a run takes: pods scheduled, initializing
(containers, the world, model and data), initialized, training, evaluated, training over,
Succeeded, with times that never go back; and ``status.startup`` split in its parts.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import apply_objects, eventually, get_json, mdr
from test_e2e_real_training import controller_pod, run_values, shapes_volumes, train_image

from megdet.progress import parse_time

__all__ = ["controller_pod", "train_image"]  # the fixtures, shared with the real-training module

NS = "real-lifecycle"
RUN = "life"
pytestmark = [pytest.mark.timeout(2400), pytest.mark.real_pods]
#: The conditions of a run's life (controller/lifecycle.py) and the job's phases.
TYPES = ("PodsScheduled", "Initialized", "Training", "Evaluating", "Running", "Succeeded")


@pytest.fixture(scope="module")
def volumes(kube, real_node) -> Iterator[dict[str, Path]]:
    yield from shapes_volumes(kube, NS)


class RunWatch:
    """``kubectl get mdr --watch -o json`` of one run (by a field selector: a watch of a name
    that does not exist yet fails); every version it delivers, in order, with the monotonic
    time it arrived."""

    def __init__(self, kube, ns: str, name: str) -> None:
        self.versions: list[tuple[float, dict[str, Any]]] = []
        self.proc = subprocess.Popen(
            [
                kube.binary("kubectl"),
                "get",
                "mdr",
                "-n",
                ns,
                "--field-selector",
                f"metadata.name={name}",
                "--watch",
                "-o",
                "json",
            ],
            env=kube.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        decoder, buffer = json.JSONDecoder(), ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            buffer += line
            try:
                obj, end = decoder.raw_decode(buffer.lstrip())
            except ValueError:
                continue
            buffer = buffer.lstrip()[end:]
            for item in obj.get("items", []) if obj.get("kind", "").endswith("List") else [obj]:
                self.versions.append((time.monotonic(), item))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def passed_through(versions: list[tuple[float, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each (type, status, reason) of TYPES as the watch first delivered it, in that order."""
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    for arrived, obj in versions:
        for cond in (obj.get("status") or {}).get("conditions") or []:
            key = (cond["type"], cond["status"], cond.get("reason", ""))
            if cond["type"] in TYPES and key not in seen:
                seen[key] = {"key": key, "at": cond.get("lastTransitionTime"), "seen": arrived}
    return list(seen.values())


def test_a_run_passes_through_its_conditions_in_order_with_their_times(
    kube, train_image, volumes, controller_pod
) -> None:
    spec = {k: v for k, v in run_values(train_image).items() if k != "runName"}
    # An evaluation half-way (5 reference iterations: 10 at this batch) and one at the end,
    # each reported when it starts.
    overrides = {**spec.get("extraOverrides", {}), "TEST.EVAL_PERIOD": 5}
    spec.update(gpus=1, maxIter=10, steps=[8], warmupIters=2, extraOverrides=overrides)
    watch = RunWatch(kube, NS, RUN)
    started = time.monotonic()
    try:
        time.sleep(3)  # the watch established (a run made before it is in its first list)
        assert watch.proc.poll() is None, "the watch ended"
        apply_objects(kube, mdr(RUN, NS, spec))
        eventually(
            lambda: get_json(kube, "mdr", RUN, "-n", NS).get("status", {}).get("phase")
            == "Succeeded",
            timeout=1500,
            interval=2,
            message="the run Succeeded",
        )
        # The status write after Succeeded (Training over) reaches the watch too.
        eventually(
            lambda: (get_json(kube, "mdr", RUN, "-n", NS)["status"].get("stage") == "Succeeded"),
            timeout=60,
            message="the Stage Succeeded",
        )
        time.sleep(2)
    finally:
        watch.stop()
    took = time.monotonic() - started
    path = passed_through(watch.versions)
    order = [f"{'/'.join(p['key'])} @ {p['at']}" for p in path]
    print(f"\nlifecycle in {took:.0f} s, as the watch delivered it:\n  " + "\n  ".join(order))
    keys = [p["key"] for p in path]

    def first(kind: str, status: str, reason: str | None = None) -> int:
        for i, (k, s, r) in enumerate(keys):
            if (k, s) == (kind, status) and reason in (None, r):
                return i
        raise AssertionError(f"{kind}={status} {reason or ''} never seen: {order}")

    steps = [
        first("PodsScheduled", "True"),
        first("Initialized", "False"),
        first("Initialized", "True", "Loaded"),
        first("Training", "True", "FirstIteration"),
        first("Evaluating", "True") if ("Evaluating", "True", "Evaluating") in keys else None,
        first("Succeeded", "True"),
    ]
    taken = [i for i in steps if i is not None]
    assert taken == sorted(taken), order
    # Initializing said why in the kubelet's and the trainer's words, in this order.
    reasons = [r for k, s, r in keys if (k, s) == ("Initialized", "False")]
    rank = {"WaitingForKubelet": 0, "PodInitializing": 1, "ContainerCreating": 1,
            "Rendezvous": 2, "LoadingDataAndModel": 3}  # fmt: skip
    assert reasons and all(r in rank for r in reasons), reasons
    assert [rank[r] for r in reasons] == sorted(rank[r] for r in reasons), reasons
    # The evaluation at the end was reported (True while it ran, or only its end if a flush
    # came after it) and training is over.
    assert any(k == "Evaluating" for k, _s, _r in keys), order
    assert first("Training", "False") > first("Training", "True")
    # The times of the path never go back.
    times = [parse_time(path[i]["at"]) for i in taken]
    assert times == sorted(times), order
    status = get_json(kube, "mdr", RUN, "-n", NS)["status"]
    startup = status["startup"]
    print(f"startup: {startup}")
    for part in (
        "schedulingSeconds", "containerStartSeconds", "rendezvousSeconds", "dataModelSeconds",
        "firstIterationSeconds", "totalSeconds",
    ):  # fmt: skip
        assert isinstance(startup.get(part), int), startup
    assert startup["attempt"] == 1
    assert startup["totalSeconds"] >= startup["rendezvousSeconds"] + startup["dataModelSeconds"]
    stages = [obj["status"].get("stage") for _t, obj in watch.versions if obj.get("status")]
    stages = [s for i, s in enumerate(stages) if s and (i == 0 or s != stages[i - 1])]
    print(f"stages: {stages}")
    assert stages[-1] == "Succeeded" and "Training" in stages and "Initializing" in stages
    # Once it trained, the stage never goes back to a step before training.
    after = stages[stages.index("Training") :]
    assert not {"Pending", "Scheduling", "Initializing"} & set(after), stages
    header, row = kube.kubectl("get", "mdr", RUN, "-n", NS).stdout.splitlines()[:2]
    assert row[header.index("STAGE") :].split()[0] == "Succeeded"  # columns are aligned
    kube.kubectl("delete", "mdr", RUN, "-n", NS, "--wait=false", check=False)
