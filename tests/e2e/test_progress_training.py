"""A real training run reports its progress to the controller on the real control plane.

Two CPU (gloo) workers train the tiny config on the host, as a run's pods would: rank 0 posts to
the controller's HTTPS endpoint with a token minted by the TokenRequest API for the run's
audience and bound to the run's (kwok) Master pod, verifying the controller's certificate with
the CA the controller published in the namespace. The MegDetRun's status.progress and
`kubectl get mdr` follow the run; a resumed run continues from its checkpoint; a stopped
endpoint costs the run nothing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import (
    apply_objects,
    eventually,
    get_or_none,
    mdr,
    namespace,
    pods_of,
    token_audience,
)

from megdet import progress as protocol
from tests.tiny_train import train_command

NS = "progress-train-e2e"
RUN = "tiny"


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict[str, Path]:
    from megdet.trainer.shapes import make_shapes

    return make_shapes(tmp_path_factory.mktemp("shapes"), train=32, val=8, seed=1)


@pytest.fixture(scope="module")
def reporting(kube, controller, tmp_path_factory) -> dict[str, str]:
    """The env the run chart gives a run's pods, with host paths for the token and CA files."""
    ns = namespace(kube, NS)
    apply_objects(kube, mdr(RUN, ns, {"gpus": 8}))
    found = eventually(
        lambda: pods_of(kube, ns, f"training.kubeflow.org/job-name={RUN}"),
        timeout=120,
        message="the run's pod",
    )[0]
    pod, audience = found["metadata"]["name"], token_audience(found)
    ca = eventually(
        lambda: get_or_none(kube, "configmap", "megdet-progress-ca", "-n", ns),
        message="the controller's CA in the namespace",
    )["data"]["ca.crt"]
    token = kube.kubectl(
        "create", "token", "default", "-n", ns, f"--audience={audience}",
        "--bound-object-kind=Pod", f"--bound-object-name={pod}",
    ).stdout.strip()  # fmt: skip
    folder = tmp_path_factory.mktemp("secrets")
    (folder / "ca.crt").write_text(ca)
    (folder / "token").write_text(token)
    url = f"https://127.0.0.1:{controller.progress_port}{protocol.run_status_path(ns, RUN)}"
    return {
        protocol.ENV_URL: url,
        protocol.ENV_CA_CERT: str(folder / "ca.crt"),
        protocol.ENV_TOKEN: str(folder / "token"),
        "MEGDET_PROGRESS_INTERVAL": "2",
    }


def train(shapes, output: Path, env: dict[str, str], max_iter: int) -> subprocess.CompletedProcess:
    cmd = train_command(
        shapes, output,
        "SOLVER.MAX_ITER", str(max_iter), "SOLVER.STEPS", "(5,)", "SOLVER.WARMUP_ITERS", "2",
        "SOLVER.CHECKPOINT_PERIOD", "5", "TEST.EVAL_PERIOD", "10", "SEED", "7",
    )  # fmt: skip
    result = subprocess.run(
        cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def progress(kube) -> dict[str, Any]:
    run = get_or_none(kube, "mdr", "-n", NS, RUN) or {}
    return (run.get("status") or {}).get("progress") or {}


def test_a_training_run_reports_and_resumes_where_users_look(
    kube, controller, reporting, shapes, tmp_path
) -> None:
    out = tmp_path / "run"
    train(shapes, out, reporting, max_iter=10)
    # The controller writes status at most once per --progress-interval (30 s by default).
    done = eventually(
        lambda: (p := progress(kube)).get("iteration") == 10 and p.get("evalIteration") and p,
        timeout=120,
        message="the finished run's progress in status.progress",
    )
    assert done["maxIter"] == 10 and done["percent"] == 100
    assert done["etaSeconds"] == 0
    assert done["checkpointIteration"] in (9, 10)
    assert done["evalIteration"] == 10 and isinstance(done["ap"], int | float)
    batch = json.loads((out / "plan.json").read_text())["global_batch"]
    assert done["imagesSeen"] == 10 * batch and done["plannedImages"] == 10 * batch
    assert done["imagesPerSecond"] > 0
    table = kube.kubectl("get", "mdr", "-n", NS, RUN).stdout
    header, row = table.splitlines()[:2]
    assert header.split()[6:9] == ["PROGRESS", "ETA", "AP"]
    assert row.split()[6] == "100"

    # Resumed with a longer schedule: the iteration continues from the checkpoint, and the
    # ETA is computed again for the new end.
    train(shapes, out, reporting, max_iter=20)
    # The run has ended: its last reports (the iteration-40 step, then the final evaluation)
    # may fall in one interval, and the later one is written when the interval is over.
    resumed = eventually(
        lambda: (p := progress(kube)).get("iteration") == 20 and p.get("evalIteration") == 20 and p,
        timeout=120,
        message="the resumed run's final evaluation in status.progress",
    )
    assert resumed["maxIter"] == 20 and resumed["percent"] == 100
    assert resumed["checkpointIteration"] >= 15 and isinstance(resumed["ap"], int | float)
    assert resumed["updatedTime"] > done["updatedTime"]


def test_a_stopped_endpoint_costs_the_run_nothing(shapes, tmp_path, reporting) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # nothing listens here once the socket closes
    env = {**reporting, protocol.ENV_URL: f"https://127.0.0.1:{closed}/status"}
    train(shapes, tmp_path / "offline", env, max_iter=10)
    assert (tmp_path / "offline" / "model_final.pth").exists()
    # Logged once per kind of failure, not once per step or per report (about 6 were due).
    log = (tmp_path / "offline" / "log.txt").read_text().splitlines()
    failed = [line for line in log if "Progress report to" in line and "failed" in line]
    assert len(failed) == 1, failed
    assert "ConnectionRefusedError" in failed[0] and "training goes on" in failed[0]
