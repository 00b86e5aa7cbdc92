"""An elastic MegDetRun resized while it trains, in real pods on the real node.

A run of 2 pods (gpus 2, gpusPerNode 1, ``elastic`` 1..2) trains the tiny detector on the
shapes dataset with the ``train-ci`` image (as tests/e2e/test_e2e_real_training.py does). After
its first checkpoint its ``spec.gpus`` is patched to 1: the controller records the resize,
deletes the PyTorchJob in the foreground (the kubelet's SIGTERM: the trainer saves where it
stops), and once the job and its pods are gone creates it with one pod; the trainer there
re-plans for 1 worker (keep-batch: the global batch 4 kept through 2 accumulation steps).
After that job's next checkpoint, ``gpus`` goes back to 2, and the run trains to Succeeded.
The run's status then shows three segments and attempt 3, the trainer's log on the output
volume both re-plans, and its plan.json the same three segments.

Measured: the time from each patch to the re-plan line of the new job's first pod (the last
line the trainer logs before its first iteration at the new size), printed for the report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import apply_objects, eventually, get_json, helm, mdr, pods_of
from test_e2e_real_training import run_values, shapes_volumes, train_image

from cluster.node import TAINT_KEY

__all__ = ["train_image"]  # the fixture, shared with the real-training module

NS = "real-elastic"
RUN = "stretchy"
#: The tiny run, longer than the real-training module's so that two resizes fit in it:
#: checkpoints every 10 iterations at the global batch of 4 (which keep-batch keeps).
MAX_ITER = 40
pytestmark = [pytest.mark.timeout(2400), pytest.mark.real_pods]


@pytest.fixture(scope="module")
def volumes(kube, real_node) -> Iterator[dict[str, Path]]:
    """The shapes dataset and an empty output folder, each on a PersistentVolume."""
    yield from shapes_volumes(kube, NS)


@pytest.fixture(scope="module")
def real_node_policy(kube, controller, operator_chart, tmp_path_factory) -> Iterator[None]:
    """The cluster's MegDet policy lets runs tolerate the real node's taint (both engines: the
    admission policy from the chart's values, the host controller from the policy ConfigMap it
    reads at start); rolled back afterwards."""
    values = tmp_path_factory.mktemp("policy") / "values.yaml"
    keys = ["nvidia.com/gpu", TAINT_KEY]
    values.write_text(yaml.safe_dump({"policy": {"tolerationKeys": keys}}))
    history = json.loads(
        helm(kube, "history", operator_chart, "-n", "megdet-system", "-o", "json").stdout
    )
    revision = history[-1]["revision"]
    helm(
        kube, "upgrade", operator_chart, "charts/megdet-operator", "-n", "megdet-system",
        "--reuse-values", "-f", str(values), "--wait", "--timeout=300s", timeout=360,
    )  # fmt: skip
    controller.stop()
    controller.start()
    try:
        yield
    finally:
        helm(
            kube, "rollback", operator_chart, str(revision), "-n", "megdet-system", "--wait",
            "--timeout=300s", timeout=360, check=False,
        )  # fmt: skip
        controller.stop()
        controller.start()


def status(kube) -> dict[str, Any]:
    return get_json(kube, "mdr", RUN, "-n", NS).get("status") or {}


def checkpoints(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("model_*.pth")} if folder.is_dir() else set()


def master_log(kube, job_uid: str) -> str:
    """The log of the Master pod of the job with ``job_uid`` ("" until it has one)."""
    pods = pods_of(kube, NS, f"training.kubeflow.org/job-name={RUN}")
    for pod in pods:
        owners = {ref.get("uid") for ref in pod["metadata"].get("ownerReferences") or []}
        role = pod["metadata"]["labels"].get("training.kubeflow.org/replica-type")
        if job_uid in owners and role == "master":
            name = pod["metadata"]["name"]
            return kube.kubectl("logs", "-n", NS, name, check=False).stdout
    return ""


def resize(kube, gpus: int, attempt: int, workers: int) -> float:
    """Patch ``spec.gpus`` and wait for the new job's Master to log its re-plan for
    ``workers``; returns the seconds from the patch to that line."""
    patched = time.monotonic()
    kube.kubectl(
        "patch", "mdr", RUN, "-n", NS, "--type=merge", "-p", json.dumps({"spec": {"gpus": gpus}})
    )
    st = eventually(
        lambda: (s := status(kube)).get("attempt") == attempt and s,
        timeout=600,
        interval=1,
        message=f"attempt {attempt}",
    )
    eventually(
        lambda: f"images on {workers} workers (was" in master_log(kube, st["jobUID"]),
        timeout=900,
        interval=1,
        message=f"the re-plan for {workers} workers in the new Master's log",
    )
    return time.monotonic() - patched


def test_a_run_resized_to_one_gpu_and_back_trains_to_succeeded(
    kube, controller, real_node_policy, train_image, volumes
) -> None:
    spec = {k: v for k, v in run_values(train_image).items() if k != "runName"}
    spec.update(
        maxIter=MAX_ITER,
        steps=[30],
        elastic={"minGpus": 1, "maxGpus": 2, "resize": "keep-batch"},
    )
    apply_objects(kube, mdr(RUN, NS, spec))
    folder = volumes["output"] / RUN

    def checkpoint_after(seen: set[str]) -> set[str] | None:
        new = checkpoints(folder) - seen
        return new or None

    eventually(
        lambda: checkpoint_after(set()), timeout=1200, interval=2, message="a first checkpoint"
    )
    assert status(kube)["gpus"] == 2 and status(kube)["attempt"] == 1
    down = resize(kube, 1, 2, 1)
    job = get_json(kube, "pytorchjob", RUN, "-n", NS)
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    seen = checkpoints(folder)
    eventually(
        lambda: checkpoint_after(seen), timeout=900, interval=2, message="a 1-GPU checkpoint"
    )
    up = resize(kube, 2, 3, 2)

    st = eventually(
        lambda: (s := status(kube)).get("phase") in ("Succeeded", "Failed") and s,
        timeout=1200,
        interval=5,
        message="the run to finish",
    )
    assert st["phase"] == "Succeeded", st
    assert st["attempt"] == 3 and st["gpus"] == 2 and "resize" not in st
    assert [(s["attempt"], s["gpus"], s["reason"]) for s in st["segments"]] == [
        (1, 2, "Created"),
        (2, 1, "Resized"),
        (3, 2, "Resized"),
    ]
    assert all(s["globalBatch"] == 4 for s in st["segments"])  # keep-batch
    events = json.loads(
        kube.kubectl(
            "get", "events", "-n", NS, "--field-selector", f"involvedObject.name={RUN}", "-o",
            "json",
        ).stdout
    )["items"]  # fmt: skip
    assert sorted(e["message"][:15] for e in events if e["reason"] == "Resized") == [
        "from 1 to 2 GPU",
        "from 2 to 1 GPU",
    ]
    assert not [e for e in events if e["type"] == "Warning"], events
    header, row = kube.kubectl("get", "mdr", RUN, "-n", NS).stdout.splitlines()[:2]
    assert header.split()[:3] == ["NAME", "PHASE", "GPUS"] and row.split()[2] == "2"

    # The trainer's side: one log (rank 0 appends every attempt's), both re-plans, and three
    # segments in plan.json at the kept batch, their images adding up to the planned total.
    log = (folder / "log.txt").read_text()
    assert "images on 1 workers (was 2 workers" in log, log[-4000:]
    assert "images on 2 workers (was 1 workers" in log, log[-4000:]
    plan = json.loads((folder / "plan.json").read_text())
    segments = plan["segments"]
    assert [s["world_size"] for s in segments] == [2, 1, 2]
    assert [s["global_batch"] for s in segments] == [4, 4, 4]
    assert [s["accumulation_steps"] for s in segments] == [1, 2, 1]
    assert segments[-1]["images_end"] == MAX_ITER * 4
    assert (folder / "model_final.pth").stat().st_size > 0
    print(f"\nresize 2 -> 1 GPUs: {down:.1f} s from the patch to the re-plan line")
    print(f"resize 1 -> 2 GPUs: {up:.1f} s from the patch to the re-plan line")
