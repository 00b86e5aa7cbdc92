"""What the live monitoring test scrapes: a real 2-worker CPU training run and the real
controller against kmock, each serving its /metrics on 127.0.0.1.

The controller part reuses the controller tests' kmock emulator and operator thread
(tests/controller/kmock_helpers.py): no API server can run here,
so kmock stands in for it, and the operator is the real kopf one. It drives runs through the
phases the fleet dashboard shows (Pending, Invalid, Running, Restarting, Succeeded, Failed and
a delete), then serves :data:`megdet.controller.metrics.REGISTRY` as the controller pod does.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.tiny_train import train_command

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "vision"  # the controller tests' namespace; the training run lives there too
TRAINING_RUN = "coco-live"


def training_command(shapes: dict[str, Path], output: Path, port: int) -> list[str]:
    """A 2-worker CPU run that evaluates, checkpoints and checks SyncBN within seconds.

    MAX_ITER is far away: the test stops the run with SIGTERM (the trainer's clean stop: it
    saves a checkpoint and exits) once every training series has been scraped.
    """
    return train_command(
        shapes, output,
        "SOLVER.MAX_ITER", "1000", "SOLVER.STEPS", "(900,)", "SOLVER.WARMUP_ITERS", "2",
        "SOLVER.CHECKPOINT_PERIOD", "2", "TEST.EVAL_PERIOD", "3",
        "MEGDET.SYNCBN_CHECK_PERIOD", "2", "MEGDET.METRICS.PORT", str(port),
        "INPUT.MIN_SIZE_TRAIN", "(96,)", "INPUT.MAX_SIZE_TRAIN", "96",
        "INPUT.MIN_SIZE_TEST", "96", "INPUT.MAX_SIZE_TEST", "96",
    )  # fmt: skip


class TrainingRun:
    """The training run as a process group, stopped with SIGTERM (then SIGKILL)."""

    def __init__(self, command: list[str], log: Path) -> None:
        self.log = log
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the trainer picks its own per port
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 90.0) -> int:
        """SIGTERM the launcher, as the kubelet does to a pod's main process; it stops its
        workers (they save a checkpoint) and exits 143. Returns the exit status."""
        if self.running():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill_group()
                self.proc.wait(timeout=30)
        return self.proc.returncode

    def group_alive(self) -> list[int]:
        """Live (not zombie) processes left in the run's process group: workers, helpers."""
        return _live_group_members(self.proc.pid)

    def kill_group(self) -> None:
        if self.group_alive():
            os.killpg(self.proc.pid, signal.SIGKILL)


def _live_group_members(pgid: int) -> list[int]:
    # A zombie whose parent exited stays until PID 1 reaps it (some container inits never
    # do): it holds no resources, so only running or sleeping members count.
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            members.append(int(stat.parent.name))
    return members


def _controller_test_helpers() -> Any:
    """tests/controller/kmock_helpers.py, the controller tests' own emulator and operator."""
    if "kmock_helpers" in sys.modules:  # the controller tests ran first in this session
        return sys.modules["kmock_helpers"]
    path = ROOT / "tests" / "controller" / "kmock_helpers.py"
    spec = importlib.util.spec_from_file_location("kmock_helpers", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kmock_helpers"] = module
    spec.loader.exec_module(module)
    return module


#: Prometheus's identity towards the controller: the token it sends, the user it stands for.
SCRAPER_TOKEN = "prometheus-token-for-the-live-test"
SCRAPER_USER = "system:serviceaccount:monitoring:prometheus"


class GrantScraper:
    """Stands in for the API server's TokenReview and SubjectAccessReview (kmock answers
    neither): SCRAPER_TOKEN is SCRAPER_USER, who may get /metrics; any other token is invalid.
    tests/e2e/test_e2e_metrics_auth.py asks a real API server."""

    def authenticate(self, token: str):
        from megdet.controller.tokenauth import User

        if token != SCRAPER_TOKEN:
            return None
        return User(SCRAPER_USER, groups=("system:serviceaccounts",))

    def authorize(self, user, verb: str, path: str) -> tuple[bool, str]:
        return (user.username == SCRAPER_USER and (verb, path) == ("get", "/metrics"), "")


class ControllerUnderTest:
    """kmock + the real operator in threads; the controller REGISTRY served on ``port`` as
    the pod serves it by default: HTTPS with a self-signed certificate, bearer token checked
    (by :class:`GrantScraper` here)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._server = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)

    def start(self, timeout: float = 60.0) -> ControllerUnderTest:
        from megdet.controller import metrics
        from megdet.controller.metrics import server_ssl_context
        from megdet.controller.tokenauth import TokenAuthorizer

        self._server = metrics.serve(
            self.port,
            "127.0.0.1",
            authorizer=TokenAuthorizer(GrantScraper()),
            ssl_context=server_ssl_context(),
        )
        self._thread.start()
        if not self.ready.wait(timeout):
            raise TimeoutError(f"controller scenario not done after {timeout}s: {self.error!r}")
        if self.error is not None:
            raise self.error
        return self

    def stop(self) -> None:
        if not self._thread.is_alive() and self._server is None:
            return  # never started
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        if self._server is not None:
            self._server.close()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:
            self.error = err
            self.ready.set()

    async def _main(self) -> None:
        h = _controller_test_helpers()

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with h.emulated() as api:
            op = await h.start_operator(str(api.url))
            try:
                await self._scenario(h, api)
                self.ready.set()
                await self._stop.wait()
            finally:
                await h.stop_operator(op)

    @staticmethod
    async def _scenario(h: Any, api: Any) -> None:
        def phase(name: str) -> str | None:
            return ((h.get(api, h.RUNS, name) or {}).get("status") or {}).get("phase")

        async def job_status(name: str, *conditions: tuple[str, str]) -> None:
            body = [
                {"type": t, "status": s, "reason": f"PyTorchJob{t}", "message": t}
                for t, s in conditions
            ]
            await h.patch(api, h.PYTORCHJOBS, name, {"status": {"conditions": body}}, status=True)

        async def reach(name: str, wanted: str) -> None:
            await h.eventually(lambda: phase(name) == wanted, message=f"{name} {wanted}")

        await h.apply(api, h.run_body("queued", {"gpus": 16, "gpusPerNode": 8}))
        await h.apply(api, h.run_body("bad", {"gpus": 12, "gpusPerNode": 8}))
        await h.apply(api, h.run_body("done"))
        await h.apply(api, h.run_body("broken"))
        await h.apply(api, h.run_body("gone"))
        for name in ("queued", "done", "broken", "gone"):
            await reach(name, "Pending")
        await reach("bad", "Invalid")
        await job_status("done", ("Created", "True"), ("Running", "True"))
        await reach("done", "Running")
        await job_status("done", ("Created", "True"), ("Restarting", "True"))
        await reach("done", "Restarting")
        await job_status("done", ("Created", "True"), ("Running", "False"), ("Succeeded", "True"))
        await reach("done", "Succeeded")
        await job_status("broken", ("Created", "True"), ("Failed", "True"))
        await reach("broken", "Failed")
        await h.delete(api, h.RUNS, "gone")
        await h.eventually(lambda: h.get(api, h.RUNS, "gone") is None, message="gone deleted")
