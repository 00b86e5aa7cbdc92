"""The run chart gives `megdet launch` what it needs: the grace period, restarts, the run id.

Rendered with the real Helm engine for both targets; the env of every trainer container is fed
to the launcher's own parser, so the two sides cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from megdet.image.topology import SHUTDOWN_MARGIN_SECONDS, topology_from_env, torchrun_arguments
from megdet.trainer.workers import POD_MILLICPUS_ENV

CHART = Path(__file__).resolve().parents[2] / "charts" / "megdet"


def containers(obj: Any) -> Iterator[dict]:
    """Every container spec anywhere in a rendered object."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "containers" and isinstance(value, list):
                yield from value
            else:
                yield from containers(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from containers(item)


def trainer_envs(values: dict) -> list[dict[str, str]]:
    with helm_python.Chart.load(str(CHART)) as chart:
        out = chart.render(values=values, name="coco-run", namespace="vision", is_install=True)
    envs = []
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            for container in containers(doc or {}):
                env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
                if "MEGDET_GRACE_PERIOD_SECONDS" in env:
                    envs.append(env)
    return envs


@pytest.mark.parametrize("target", ["pytorchjob", "trainjob"])
def test_every_trainer_container_carries_the_launch_settings(target):
    values = {
        "target": target, "gpus": 16, "gpusPerNode": 8,
        "terminationGracePeriodSeconds": 600, "workerRestarts": 2,
    }  # fmt: skip
    envs = trainer_envs(values)
    assert envs, "no trainer container carries MEGDET_GRACE_PERIOD_SECONDS"
    for env in envs:
        assert env["MEGDET_GRACE_PERIOD_SECONDS"] == "600"
        assert env["MEGDET_MAX_RESTARTS"] == "2"
        assert env["MEGDET_RUN_ID"] == "coco-run-megdet"
        # What the launcher makes of it, with the operator's part added.
        pod = {**env, "PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "8",
               "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "23456"}  # fmt: skip
        args = torchrun_arguments(topology_from_env(pod, visible_gpus=8))
        assert f"--shutdown-timeout={600 - SHUTDOWN_MARGIN_SECONDS}" in args
        assert "--max-restarts=2" in args and "--rdzv-id=coco-run-megdet" in args


def test_worker_restarts_is_validated_by_the_schema():
    with pytest.raises(Exception, match="workerRestarts"):
        trainer_envs({"workerRestarts": -1})


@pytest.mark.parametrize("target", ["pytorchjob", "trainjob"])
def test_every_trainer_container_is_told_its_cpu_request_for_the_trainers_threads(target):
    with helm_python.Chart.load(str(CHART)) as chart:
        out = chart.render(
            values={"target": target, "resources": {"qos": "Burstable", "cpu": "500m"}},
            name="coco-run", namespace="vision", is_install=True,
        )  # fmt: skip
    found = [
        (e.get("valueFrom"), container["resources"]["requests"]["cpu"])
        for path, text in out.items()
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        for container in containers(doc or {})
        for e in container.get("env", [])
        if e["name"] == POD_MILLICPUS_ENV
    ]
    # The kubelet resolves it to the container's own request in millicpus (500 here), which
    # trainer/workers.py's cpu_threads reads.
    ref = {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}
    assert found and all(f == (ref, "500m") for f in found), found
