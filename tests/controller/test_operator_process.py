"""`megdet controller` as the image runs it: a process against kmock (no API server runs here).

Logs in from a kubeconfig, creates the job for an applied run, serves /metrics and /healthz on
its two ports, and exits cleanly on SIGTERM (what Kubernetes sends on a rollout).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml
from kmock_helpers import PYTORCHJOBS, RUNS, apply, eventually, get, run_body

from megdet.cluster.control_plane import free_port


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
        text = await asyncio.to_thread(fetch, f"http://127.0.0.1:{metrics_port}/metrics")
        assert text is not None and 'megdet_controller_reconciles_total{result="success"}' in text
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
