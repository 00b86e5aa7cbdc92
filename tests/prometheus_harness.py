"""Run a real Prometheus and promtool from Python: the harness the monitoring tests use.

The binaries come from Debian's ``prometheus`` package, unpacked into the virtual environment
by scripts/install_prometheus.py (``make test`` runs it); ``MEGDET_PROMETHEUS_BIN`` may name
another folder holding ``prometheus`` and ``promtool``.

:class:`PrometheusServer` starts one server on 127.0.0.1 on a free port with its own config
and storage folder, answers instant queries through the HTTP API (``/api/v1/query``) and stops
it cleanly.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "BINARY_ENV",
    "PrometheusError",
    "PrometheusServer",
    "binary",
    "free_port",
    "promtool",
]

BINARY_ENV = "MEGDET_PROMETHEUS_BIN"


class PrometheusError(RuntimeError):
    """Prometheus refused a query or did not start; the message holds its own words."""


def binary(name: str) -> Path:
    """Path of ``prometheus`` or ``promtool``; a clear error when they are not installed."""
    folder = Path(os.environ.get(BINARY_ENV) or Path(sys.prefix) / "prometheus" / "usr" / "bin")
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: run `python scripts/install_prometheus.py` (make test does) or "
            f"set {BINARY_ENV} to a folder holding prometheus and promtool"
        )
    return path


def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None):
    """Run promtool; returns the CompletedProcess (text), never raises on a failing check."""
    return subprocess.run(
        [str(binary("promtool")), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
        timeout=120,
    )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class PrometheusServer:
    """A Prometheus server in ``workdir`` scraping what ``scrape_configs`` say.

    ``rule_files`` are loaded too, so their rules are evaluated like in a cluster.
    """

    workdir: Path
    scrape_configs: list[dict[str, Any]]
    rule_files: tuple[Path, ...] = ()
    interval: str = "1s"

    def __post_init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self.log = self.workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        """The prometheus.yml this server runs with."""
        return {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": self.scrape_configs,
        }

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        """Start the server and wait until it is ready; raises PrometheusError with its log."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.port = free_port()
        with self.log.open("wb") as log:
            self._proc = subprocess.Popen(
                [
                    str(binary("prometheus")),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise PrometheusError(f"prometheus exited early:\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise PrometheusError(f"prometheus not ready after {timeout}s:\n{self.log.read_text()}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api(self, path: str, params: dict[str, str] | list[tuple[str, str]] | None = None):
        """GET ``/api/v1/<path>``; returns ``data``, raises PrometheusError on status error."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as err:  # 400/422: a bad query, with Prometheus' reason
            body = json.load(err)
        if body.get("status") != "success":
            raise PrometheusError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> dict[str, Any]:
        """An instant query; ``{"resultType": ..., "result": [...]}``."""
        return self.api("query", {"query": expr})

    def wait_for(self, expr: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Poll an instant query until it returns a series; raises PrometheusError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)["result"]
            if result:
                return result
            if time.monotonic() > deadline:
                raise PrometheusError(f"no series for {expr!r} after {timeout}s")
            time.sleep(0.5)
