"""The progress reporter (trainer/progress_reporter.py) against a real local HTTPS server.

The server is stdlib ``http.server`` behind TLS with a certificate from the project's own CA
code (cluster.pki, the ``cryptography`` package); it records every POST. The loops are
detectron2's own ``TrainerBase.train`` with its real ``EvalHook`` and ``PeriodicCheckpointer``
on an ``AtomicCheckpointer``; only the step's work is a stand-in. A fake monotonic clock makes
the rates and the interval exact. Payloads are read back with ``megdet.progress.to_status``,
the function the controller uses.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import ssl
import subprocess
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch import nn

from megdet.plan import plan_run
from megdet.progress import ENV_CA_CERT, ENV_TOKEN, ENV_URL, STAGES, Progress, to_status
from tests.json_http import JsonHandler
from tests.tiny_train import train_command

STATUS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/r50/status"
#: The reporter's logger; ``captured_warnings`` (conftest) puts its warnings in caplog.
LOGGER = "megdet.trainer.progress_reporter"


# --- the server -------------------------------------------------------------------------


class _Handler(JsonHandler):
    def do_POST(self) -> None:
        server: StatusServer = self.server  # type: ignore[assignment]
        body = self.read_body()
        server.posts.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        )
        server.entered.set()
        if server.mode == "hang":
            server.release.wait()
        code = 500 if server.mode == "500" else 200
        answer = (
            {"kind": "Status", "status": "Failure", "message": "etcd is on fire", "code": 500}
            if code == 500
            else json.loads(body)
        )
        self.reply_json(code, answer)


class StatusServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, crt: Path, key: Path, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(crt, key)
        self.socket = context.wrap_socket(self.socket, server_side=True)
        self.mode = mode
        self.posts: list[dict] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server_address[1]}{STATUS_PATH}"

    def statuses(self) -> list[dict]:
        """Each post's body as status.progress (to_status must find nothing wrong)."""
        out = []
        for post in self.posts:
            body = json.loads(post["body"])
            status, problems = to_status(body["trainerStatus"])
            assert problems == [], problems
            out.append(status)
        return out


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from cluster.pki import CertificateAuthority

    folder = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority(folder / "ca")
    crt, key = ca.issue("server", "status-server", ips=["127.0.0.1"], server=True)
    other = CertificateAuthority(folder / "other")  # a CA that did not sign the server
    return SimpleNamespace(ca=ca.cert_path, crt=crt, key=key, other_ca=other.cert_path)


@pytest.fixture
def serve(pki):
    servers: list[StatusServer] = []

    def start(mode: str = "accept") -> StatusServer:
        server = StatusServer(pki.crt, pki.key, mode)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def token(tmp_path) -> Path:
    path = tmp_path / "token"
    path.write_text("token-one\n")
    return path


# --- a detectron2 loop ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _loop(step):
    from detectron2.engine.train_loop import TrainerBase

    class Loop(TrainerBase):
        steps = 0

        def run_step(self) -> None:
            self.steps += 1
            step()

    return Loop()


def _settled(reporter):
    """A hook after the reporter that waits until its report of the step has been posted, so
    each report goes out (none replaces another): what makes the post counts exact."""
    from detectron2.engine import hooks

    class Settled(hooks.HookBase):
        def before_train(self) -> None:
            assert reporter.poster.wait_idle(30)

        def after_step(self) -> None:
            assert reporter.poster.wait_idle(30)

    return Settled()


PLAN = plan_run(
    {"gpus": 1, "images_per_gpu": 8, "reference_batch": 8, "max_iter": 10, "steps": ()}
    | {"warmup_iters": 0}
)


def _reporter(url, pki, token, plan=PLAN, checkpointer=None, **kwargs):
    from megdet.trainer.progress_reporter import ProgressPoster, ProgressReporter

    timeout = kwargs.pop("timeout", 5.0)
    poster = ProgressPoster(url, str(pki.ca), str(token), timeout=timeout)
    return ProgressReporter(poster, plan, checkpointer, **kwargs)


def _checkpointer(folder: Path):
    from megdet.trainer.checkpoint import AtomicCheckpointer

    folder.mkdir(parents=True, exist_ok=True)
    return AtomicCheckpointer(nn.Linear(2, 2), save_dir=str(folder))


# --- tests ------------------------------------------------------------------------------


def test_reports_at_start_after_each_checkpoint_and_evaluation_and_at_the_end(
    serve, pki, token, tmp_path
):
    """Interval far away: exactly the event-driven reports, with the loop's facts."""
    from detectron2.engine import hooks

    server = serve()
    clock = Clock()
    checkpointer = _checkpointer(tmp_path / "out")
    reporter = _reporter(
        server.url, pki, token, checkpointer=checkpointer, interval=1e9, clock=clock
    )
    results = iter([(31.5, 50.25), (42.0, 61.0)])

    def evaluate():
        reporter.poster.wait_idle(30)  # the report before this one has gone out
        ap, ap50 = next(results)
        return {"bbox": {"AP": ap, "AP50": ap50, "AP75": 1.0}}

    def step():
        reporter.poster.wait_idle(30)
        clock.now += 2.0  # 0.5 iterations/s

    loop = _loop(step)
    loop.register_hooks(
        [
            hooks.PeriodicCheckpointer(checkpointer, 4),
            hooks.EvalHook(5, evaluate),
            reporter,
        ]
    )
    loop.train(0, 10)

    assert loop.steps == 10
    assert all(post["path"] == STATUS_PATH for post in server.posts)
    assert all(post["auth"] == "Bearer token-one" for post in server.posts)
    statuses = server.statuses()
    # Start, the first iteration, checkpoint 4, evaluation 5, checkpoint 8, model_final (10),
    # the end.
    assert [s["iteration"] for s in statuses] == [0, 1, 4, 5, 8, 10, 10]
    first, one, ckpt4, eval5, _, _, last = statuses
    assert first == {
        "iteration": 0,
        "maxIter": 10,
        "percent": 0,
        "imagesSeen": 0,
        "plannedImages": 80,
        "updatedTime": first["updatedTime"],
        "stage": "firstIteration",
        "stageTime": first["updatedTime"],
        "loadedTime": first["updatedTime"],
    }
    assert one["stage"] == "training" and one["firstIterationTime"] == one["stageTime"]
    assert ckpt4["checkpointIteration"] == 4 and "ap" not in ckpt4
    assert ckpt4["imagesPerSecond"] == 4.0  # 0.5 it/s x global batch 8
    assert ckpt4["etaSeconds"] == 12  # 6 iterations left at 0.5 it/s
    assert (eval5["ap"], eval5["ap50"], eval5["evalIteration"]) == (31.5, 50.25, 5)
    assert eval5["percent"] == 50 and eval5["imagesSeen"] == 40
    assert last["percent"] == 100 and last["etaSeconds"] == 0
    assert (last["ap"], last["ap50"], last["evalIteration"]) == (42.0, 61.0, 10)
    assert last["checkpointIteration"] == 10
    assert last["checkpointTime"] <= last["updatedTime"]
    assert last["stage"] == "finished"
    assert reporter.poster.accepted == 7 and reporter.poster.failed == 0
    assert reporter._checkpoint_saved not in checkpointer.on_saved  # unhooked at the end


def test_at_most_one_periodic_report_per_interval(serve, pki, token):
    server = serve()
    clock = Clock()
    reporter = _reporter(server.url, pki, token, interval=10.0, clock=clock)

    def step():
        clock.now += 3.0

    loop = _loop(step)
    loop.register_hooks([reporter, _settled(reporter)])
    loop.train(0, 13)
    # The first iteration at once (3 s), then 10 s after each report: steps 5 (15 s),
    # 9 (27 s), 13 (39 s); the end.
    assert [s["iteration"] for s in server.statuses()] == [0, 1, 5, 9, 13, 13]


def test_a_resumed_run_reports_the_resumed_iteration_and_its_checkpoint_first(
    serve, pki, token, tmp_path
):
    server = serve()
    checkpointer = _checkpointer(tmp_path / "out")
    checkpointer.save("model_0000006", iteration=6)  # what the run resumed from
    os.utime(tmp_path / "out" / "model_0000006.pth", (1767225600, 1767225600))
    reporter = _reporter(server.url, pki, token, checkpointer=checkpointer, interval=1e9)
    loop = _loop(lambda: None)
    loop.register_hooks([reporter])
    loop.start_iter, loop.iter, loop.max_iter = 7, 7, 10
    reporter.before_train()
    assert reporter.poster.flush(30)
    [first] = server.statuses()
    assert first["iteration"] == 7 and first["percent"] == 70 and first["imagesSeen"] == 56
    assert first["checkpointIteration"] == 7
    assert first["checkpointTime"] == "2026-01-01T00:00:00Z"


def test_the_token_file_is_read_again_for_every_post(serve, pki, token):
    from megdet.trainer.progress_reporter import ProgressPoster

    server = serve()
    poster = ProgressPoster(server.url, str(pki.ca), str(token))
    progress = Progress(iteration=1, max_iter=10, updated_time="2026-01-01T00:00:00Z")
    poster.submit(progress)
    assert poster.wait_idle(30)
    token.write_text("token-two")  # the kubelet rotated the projected token
    poster.submit(progress)
    assert poster.flush(30)
    assert [p["auth"] for p in server.posts] == ["Bearer token-one", "Bearer token-two"]


def test_a_server_the_ca_did_not_sign_gets_nothing(serve, pki, token, caplog, captured_warnings):
    from megdet.trainer.progress_reporter import ProgressPoster

    server = serve()
    poster = ProgressPoster(server.url, str(pki.other_ca), str(token))
    with captured_warnings(LOGGER):
        poster.submit(Progress(iteration=1, max_iter=10, updated_time="2026-01-01T00:00:00Z"))
        assert poster.flush(30)
    assert server.posts == [] and poster.failed == 1 and poster.accepted == 0
    assert "certificate verify failed" in caplog.text


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("mode", ["unreachable", "500", "no token file"])
def test_failures_cost_the_loop_nothing_and_are_logged_once_per_kind(
    mode, serve, pki, token, caplog, captured_warnings
):
    server = serve("500" if mode == "500" else "accept")
    url = server.url
    if mode == "unreachable":
        url = f"https://127.0.0.1:{_closed_port()}{STATUS_PATH}"
    if mode == "no token file":
        token = token.with_name("missing")
    reporter = _reporter(url, pki, token, interval=0.0)

    loop = _loop(lambda: None)
    loop.register_hooks([reporter, _settled(reporter)])  # every report is tried: 1 + 6 + 1
    with captured_warnings(LOGGER):
        loop.train(0, 6)
    assert loop.steps == 6 and loop.iter == 6  # finished, nothing raised
    assert reporter.poster.failed == 8 and reporter.poster.accepted == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    expected = {
        "unreachable": "ConnectionRefusedError",
        "500": "HTTP 500: etcd is on fire",
        "no token file": "cannot read the token file",
    }[mode]
    assert expected in warnings[0]
    assert len(server.posts) == (8 if mode == "500" else 0)


def test_a_hanging_server_never_holds_up_the_loop_and_the_newest_report_wins(
    serve, pki, token, caplog, captured_warnings
):
    """The server holds the first post until the test releases it, after training ended.

    A hook that waited for its post could not finish the loop before the release (the post's
    timeout is an hour); this one finishes all steps with exactly one post in flight.
    """
    server = serve("hang")
    reporter = _reporter(server.url, pki, token, interval=0.0, timeout=3600, flush_timeout=0.2)

    def step():
        if loop.steps == 1:  # the start report has reached the server, which holds it
            assert server.entered.wait(60)

    loop = _loop(step)
    loop.register_hooks([reporter])
    with captured_warnings(LOGGER):
        trainer = threading.Thread(target=loop.train, args=(0, 20), daemon=True)
        trainer.start()
        trainer.join(120)  # a liveness bound, not a measurement: a blocked hook never ends
        assert not trainer.is_alive(), "the training loop waited for the status server"
    assert loop.steps == 20 and loop.iter == 20
    assert server.entered.is_set() and not server.release.is_set()
    assert len(server.posts) == 1  # the first report, still held by the server
    assert reporter.poster.replaced >= 1  # the reports after it replaced each other unsent
    assert "did not go out within 0.2 s" in caplog.text

    server.release.set()
    assert reporter.poster.wait_idle(60)
    statuses = server.statuses()
    assert [s["iteration"] for s in statuses] == [0, 20]  # then only the newest: the end
    assert statuses[-1]["percent"] == 100


def test_only_rank_0_with_the_url_set_reports(monkeypatch, pki, token):
    from detectron2.utils import comm

    from megdet.trainer.progress_reporter import ProgressReporter, build_progress_hook

    env = {ENV_URL: "https://status.example:8443" + STATUS_PATH, ENV_CA_CERT: str(pki.ca),
           ENV_TOKEN: str(token)}  # fmt: skip
    monkeypatch.setattr(comm, "get_rank", lambda: 0)
    hook = build_progress_hook(PLAN, None, env)
    assert isinstance(hook, ProgressReporter) and hook.poster.url == env[ENV_URL]
    assert build_progress_hook(PLAN, None, {}) is None  # not under Trainer / the controller
    monkeypatch.setattr(comm, "get_rank", lambda: 1)
    assert build_progress_hook(PLAN, None, env) is None


def test_bad_interval_is_a_config_error_naming_the_variable_and_plain_http_is_refused(
    caplog, captured_warnings
):
    from megdet.trainer.config import ConfigError
    from megdet.trainer.progress_reporter import build_progress_hook, progress_interval

    assert progress_interval({}) == 30.0
    assert progress_interval({"MEGDET_PROGRESS_INTERVAL": "2.5"}) == 2.5
    for bad in ("soon", "-1", "inf", "nan"):
        with pytest.raises(ConfigError, match=r"MEGDET_PROGRESS_INTERVAL: .* seconds >= 0"):
            build_progress_hook(PLAN, None, {"MEGDET_PROGRESS_INTERVAL": bad})
    with captured_warnings(LOGGER):
        assert build_progress_hook(PLAN, None, {ENV_URL: "http://127.0.0.1/x"}) is None
    assert "KUBEFLOW_TRAINER_SERVER_URL: 'http://127.0.0.1/x' is not an https:// URL" in (
        caplog.text
    )


@pytest.mark.slow
def test_a_two_worker_run_reports_increasing_iterations_and_its_ap(serve, pki, token, shapes,
                                                                   tmp_path):  # fmt: skip
    server = serve()
    out = tmp_path / "run"
    cmd = train_command(
        shapes, out,
        "SOLVER.MAX_ITER", "12", "SOLVER.STEPS", "(10,)", "SOLVER.WARMUP_ITERS", "2",
        "SOLVER.CHECKPOINT_PERIOD", "6", "TEST.EVAL_PERIOD", "6",
    )  # fmt: skip
    env = os.environ | {
        ENV_URL: server.url,
        ENV_CA_CERT: str(pki.ca),
        ENV_TOKEN: str(token),
        "MEGDET_PROGRESS_INTERVAL": "0",
    }
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(post["auth"] == "Bearer token-one" for post in server.posts)
    statuses = server.statuses()
    iterations = [s["iteration"] for s in statuses]
    # One reporter (rank 0): its reports only move forward, from the start to the end.
    assert iterations == sorted(iterations) and iterations[0] == 0 and iterations[-1] == 12
    assert len(set(iterations)) >= 3
    last = statuses[-1]
    assert last["maxIter"] == 12 and last["plannedImages"] == 12 * 8
    assert last["evalIteration"] == 12 and "ap50" in last
    metrics = json.loads((out / "metrics.json").read_text())
    assert last["ap50"] == pytest.approx(metrics["bbox"]["AP50"], abs=1e-4)
    assert last["checkpointIteration"] == 12
    # The attempt's stages in the order it passed them (a report may replace an unsent one, so
    # some may be missing), and its moments in order in the last report.
    order = {stage: i for i, stage in enumerate(STAGES)}
    seen = [order[s["stage"]] for s in statuses if s["stage"] != "evaluating"]
    assert seen == sorted(seen) and statuses[0]["stage"] == "loading"
    assert last["stage"] == "finished"
    assert last["worldTime"] <= last["loadedTime"] <= last["firstIterationTime"]
    # The run's report (written before the last report goes out) and its totals in it.
    report = json.loads((out / "report.json").read_text())
    assert last["attempts"] == report["attempt_count"] == 1
    assert last["wallSeconds"] == round(report["wall_time"]["total_s"])
    assert last["stepsSeconds"] == round(report["wall_time"]["steps_s"])


def test_each_stage_of_an_attempt_is_reported_when_it_begins_with_its_moment(serve, pki, token):
    """The stages (megdet.progress.STAGES) the controller's lifecycle conditions read: loading
    before the trainer exists, firstIteration when the loop starts, training after the first
    step, evaluating before each evaluation (training again after it), finished at the end;
    each report carries the moments seen so far, in order."""
    from detectron2.engine import hooks

    server = serve()
    clock = Clock()
    wall = iter(range(1767225600, 1767225700))
    reporter = _reporter(server.url, pki, token, interval=1e9, clock=clock, wall=lambda: next(wall))
    reporter.loading()  # the world formed; model and data not built yet
    assert reporter.poster.wait_idle(30)

    def evaluate():
        reporter.evaluating()
        assert reporter.poster.wait_idle(30)
        return {"bbox": {"AP": 10.0, "AP50": 20.0}}

    loop = _loop(lambda: reporter.poster.wait_idle(30))
    loop.register_hooks([hooks.EvalHook(5, evaluate), reporter, _settled(reporter)])
    loop.train(0, 10)
    assert reporter.poster.flush(30)
    statuses = server.statuses()
    stages = [s["stage"] for s in statuses]
    assert stages == [
        "loading", "firstIteration", "training", "evaluating", "training", "evaluating",
        "finished",
    ]  # fmt: skip
    loading, ready, first, *_, last = statuses
    assert loading["worldTime"] == loading["stageTime"] and "loadedTime" not in loading
    assert ready["worldTime"] < ready["loadedTime"] == ready["stageTime"]
    assert first["loadedTime"] < first["firstIterationTime"] == first["stageTime"]
    assert (last["worldTime"], last["loadedTime"], last["firstIterationTime"]) == (
        loading["worldTime"], ready["loadedTime"], first["firstIterationTime"],
    )  # fmt: skip
    assert last["stageTime"] > first["firstIterationTime"]


def _stop_at_2(loop) -> None:
    """Train ``loop`` towards 10 iterations and stop it at iteration 2 with an exception, as
    a stop on a signal leaves the loop."""

    class Stop(Exception):
        pass

    def stop():
        if loop.iter == 2:
            raise Stop

    loop.run_step = stop
    with pytest.raises(Stop):
        loop.train(0, 10)


def test_a_run_stopped_by_a_signal_does_not_say_finished(serve, pki, token):
    server = serve()
    reporter = _reporter(server.url, pki, token, interval=1e9)
    loop = _loop(lambda: None)
    loop.register_hooks([reporter, _settled(reporter)])
    _stop_at_2(loop)
    assert reporter.poster.flush(30)
    assert [s["stage"] for s in server.statuses()][-1] == "training"


def test_the_final_report_carries_the_run_reports_totals_and_a_stopped_run_none(
    serve, pki, token, tmp_path
):
    """The run's report hook (trainer/report_hook.py) runs before the reporter: its report's
    attempts and wall time by part go out with ``finished`` (megdet.progress.REPORT_METRICS),
    in no report before it; a run stopped early has no report and sends none."""
    from test_trainer_report import write_run

    from megdet.trainer.report import build_report
    from megdet.trainer.report_hook import WriteReport

    def run(folder: str, stop: bool) -> tuple[WriteReport, list[dict]]:
        server = serve()
        hook = WriteReport(str(write_run(tmp_path / folder)))
        reporter = _reporter(server.url, pki, token, interval=1e9)
        reporter.attach(None, None, hook)
        loop = _loop(lambda: None)
        loop.register_hooks([hook, reporter, _settled(reporter)])
        _stop_at_2(loop) if stop else loop.train(0, 10)
        assert reporter.poster.flush(30)
        return hook, server.statuses()

    hook, (*before, last) = run("run", stop=False)
    assert hook.report is not None and last["stage"] == "finished"
    assert {k: last[k] for k in ("attempts", "wallSeconds", "stepsSeconds")} == {
        "attempts": 1, "wallSeconds": 12, "stepsSeconds": 6,
    }  # fmt: skip
    assert last["stepsImagesPerSecond"] == round(80 / 6, 4)
    assert all("wallSeconds" not in s for s in before)
    assert build_report(tmp_path / "run")["wall_time"]["total_s"] == 12

    # Stopped at iteration 2 (a signal): no report written, none carried.
    hook, statuses = run("stopped", stop=True)
    assert hook.report is None
    assert all("wallSeconds" not in s for s in statuses)
