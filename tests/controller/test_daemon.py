"""`megdet controller`: flags and their errors (the operator itself is tested against kmock)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from kmock_helpers import PYTORCHJOBS, RUNS, apply, eventually, get, run_body

from cluster.control_plane import free_port
from megdet.cli import build_parser, main
from megdet.controller.daemon import MAX_RANDOM_PRIORITY


def test_controller_command_defaults_match_the_chart() -> None:
    args = build_parser().parse_args(["controller"])
    assert args.metrics_port == 8080 and args.health_port == 8081
    assert args.peering == "megdet-controller" and not args.standalone
    assert 1 <= args.priority <= MAX_RANDOM_PRIORITY
    assert args.namespace == []


def test_random_priority_differs_between_replicas() -> None:
    drawn = {build_parser().parse_args(["controller"]).priority for _ in range(20)}
    assert len(drawn) > 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--priority", "high"], "--priority: 'high' is not a whole number or 'random'"),
        (["--metrics-port", "0"], "--metrics-port: 0 must be >= 1"),
        (["--api-timeout", "-1"], "--api-timeout: -1 must be a finite number > 0"),
        (["--metrics-port", "70000"], "--metrics-port 70000 must be <= 65535"),
        (
            ["--metrics-port", "9000", "--health-port", "9000"],
            "--metrics-port and --health-port must differ",
        ),
        (["--peering", "x", "--standalone"], "not allowed with argument"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["controller", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


# ------------------------------------------------------------------------------------------
# `megdet controller` as the image runs it: a process against kmock (no API server runs here).
#
# Logs in from a kubeconfig, creates the job for an applied run, serves /metrics and /healthz on
# its two ports, and exits cleanly on SIGTERM (what Kubernetes sends on a rollout).


def fetch(url: str) -> str | None:
    try:
        return urllib.request.urlopen(url, timeout=2).read().decode()
    except OSError:
        return None


async def test_controller_command_serves_runs_metrics_and_health(cluster, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": str(cluster.url)}}],
                "users": [{"name": "dev", "user": {"token": "unused"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "dev"}}],
                "current-context": "kmock",
            }
        )
    )
    metrics_port, health_port = free_port(), free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    command = [
        sys.executable, "-m", "megdet", "controller", "--standalone",
        # kmock answers no TokenReviews: plain HTTP here (tests/e2e/test_e2e_metrics_auth.py
        # scrapes the secure default against a real API server).
        "--no-metrics-secure",
        f"--metrics-port={metrics_port}", f"--health-port={health_port}",
    ]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        await apply(cluster, run_body("proc"))
        await eventually(lambda: get(cluster, PYTORCHJOBS, "proc"), timeout=60, message="job")
        await eventually(
            lambda: ((get(cluster, RUNS, "proc") or {}).get("status") or {}).get("jobName"),
            message="status",
        )
        # The reconcile counts its success after its last status write (controller/reconciler.py),
        # in the controller's process: read until it has (a CI run scraped between the two).
        success = 'megdet_controller_reconciles_total{result="success"}'
        text = None
        for _ in range(150):
            text = await asyncio.to_thread(fetch, f"http://127.0.0.1:{metrics_port}/metrics")
            if text is not None and success in text:
                break
            await asyncio.sleep(0.1)
        assert text is not None and success in text, text
        assert (
            'megdet_controller_jobs_created_total{namespace="vision",target="pytorchjob"} 1.0'
            in text
        )
        health = await asyncio.to_thread(fetch, f"http://127.0.0.1:{health_port}/healthz")
        assert health is not None
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 30)
        output = proc.stdout.read().decode() if proc.stdout else ""
    assert code == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
