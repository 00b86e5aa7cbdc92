"""The progress reporter's cost on the training step, side by side with a bare SimpleTrainer.

In 2 gloo processes (the trainer's ``run_workers``) one trainer is built as ``megdet train`` builds
it (tiny CPU config, shapes dataset, backbone SyncBN, DDP), as in ``bench.step_overhead``.
This process serves Trainer's status protocol over HTTPS (stdlib ``http.server``, a
certificate from ``cluster.pki``) and accepts every report. Loops sharing the model,
optimizer and data loader take turns in blocks of steps, several rounds, order rotated:

* ``simple``: detectron2's ``SimpleTrainer`` without hooks: the bare loop;
* ``megdet``: the built ``MegDetTrainer`` with its hooks;
* ``progress``: the same plus the progress reporter on rank 0 at the default interval
  (30 s: a few posts per run of this benchmark; what a run executes);
* ``progress-every-step``: interval 0, accepting server: rank 0 queues a report after every
  step and its poster thread posts whenever the previous post is done (TLS handshake, token
  read, CA load each time): the worst case, far beyond what a run does;
* ``unreachable``: interval 0 to a closed port: every post fails (connection refused).

Also timed: the reporter's ``after_step`` alone when no report is due (its cost on every step)
and when one is due (a snapshot queued), and one post on the poster thread.
Goal: ``progress`` / ``simple`` <= 1.02.

    .venv/bin/python -m bench.progress_overhead [--rounds 10 --block 4] [--quick] [--json]
"""

from __future__ import annotations

import contextlib
import ssl
import statistics
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench import harness, overhead

LOOPS = ("simple", "megdet", "progress", "progress-every-step", "unreachable")
#: interval (s) and target of each reporter loop
REPORTERS = {
    "progress": (30.0, "server"),
    "progress-every-step": (0.0, "server"),
    "unreachable": (0.0, "closed"),
}
GOAL = 1.02
PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/bench/trainjobs/bench/status"


class _Accept(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.posts += 1  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def _status_server(folder: Path) -> Iterator[tuple[ThreadingHTTPServer, str]]:
    """An HTTPS server accepting every post meanwhile; yields it and its CA file."""
    from cluster.pki import CertificateAuthority

    ca = CertificateAuthority(folder / "ca")
    crt, key = ca.issue("server", "status-server", ips=["127.0.0.1"], server=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(crt, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.posts = 0  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server, str(ca.cert_path)
    finally:
        server.shutdown()
        server.server_close()


def progress_worker(
    data: dict[str, str],
    out: str,
    schedule: overhead.Schedule,
    urls: dict[str, str],
    ca: str,
    token: str,
) -> dict[str, Any]:
    """One rank: build the trainer, then interleave the loops on its model."""
    from detectron2.engine import SimpleTrainer
    from detectron2.utils import comm

    from megdet.trainer.progress_reporter import ProgressPoster, ProgressReporter

    cfg, bundle, plan = harness.build_tiny_trainer(data, out, schedule.overrides)
    ours = bundle.trainer
    builtin = list(ours._hooks)
    reporters: dict[str, ProgressReporter] = {}
    if comm.is_main_process():  # what build_progress_hook does: rank 0 only
        for name, (interval, target) in REPORTERS.items():
            poster = ProgressPoster(urls[target], ca, token)
            reporters[name] = ProgressReporter(poster, plan, bundle.checkpointer, interval)
        ours.register_hooks(list(reporters.values()))
    hook_lists = {"megdet": builtin}
    for name in REPORTERS:
        hook_lists[name] = builtin + ([reporters[name]] if name in reporters else [])

    simple = harness.prepare(SimpleTrainer(bundle.model, ours.data_loader, ours.optimizer),
                             plan.max_iter)  # fmt: skip
    driven = harness.prepare(ours, plan.max_iter)  # before_train of every hook

    def block_of(name: str, steps: int) -> list[float]:
        if name == "simple":
            return harness.step_block(simple, steps)
        ours._hooks = hook_lists[name]
        return harness.step_block(driven, steps)

    timed = overhead.interleave(LOOPS, block_of, schedule)
    blocks, steps, calls = timed.blocks, timed.steps, schedule.calls

    direct: dict[str, Any] = {}
    posts: dict[str, dict[str, int]] = {}
    if reporters:
        rep = reporters["progress"]
        with driven.storage:
            rep._next_due = float("inf")
            idle = overhead.time_calls(rep.after_step, calls * 20)
            rep._next_due = 0.0
            rep._interval = 0.0
            due = overhead.time_calls(rep.after_step, calls * 20)
        poster = reporters["progress-every-step"].poster
        poster.wait_idle(30)
        snapshot = rep.snapshot()
        one_post = overhead.time_calls(lambda: poster._post(snapshot), calls)
        direct = {
            "after_step_not_due_s": harness.spread(idle),
            "after_step_due_s": harness.spread(due),
            "one_post_s": harness.spread(one_post),
        }
        for name, reporter in reporters.items():
            reporter.poster.flush(5.0)
            p = reporter.poster
            posts[name] = {"accepted": p.accepted, "failed": p.failed, "replaced": p.replaced}
    ours._hooks = builtin  # the reporters' after_train already ran (flush) above
    harness.finish(driven)
    harness.finish(simple)
    return {
        **overhead.described(cfg, schedule),
        **harness.side_by_side(blocks, steps, "simple"),
        "direct": direct,
        "posts": posts,
        "step_median_s": statistics.median(steps["simple"]),
    }


def run(
    quick: bool = False, rounds: int = 10, block: int = 4, warmup: int = 2, calls: int = 20
) -> dict[str, Any]:
    """Run the benchmark in 2 gloo processes; returns rank 0's results."""
    schedule = overhead.Schedule.of(quick, rounds, block, warmup, calls, quick_calls=2)
    with harness.scratch_dir("progress") as tmp, _status_server(Path(tmp)) as (server, ca):
        token = Path(tmp) / "token"
        token.write_text("bench-token")
        port = server.server_address[1]
        urls = {
            "server": f"https://127.0.0.1:{port}{PATH}",
            "closed": f"https://127.0.0.1:{overhead.free_port('127.0.0.1')}{PATH}",
        }
        result = overhead.run_ranks("progress", progress_worker, schedule, urls, ca, str(token))
        result["server_posts"] = server.posts  # type: ignore[attr-defined]
    return result


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f} ms"


def print_report(result: dict[str, Any]) -> None:
    overhead.print_header("Progress reporter overhead", result, "loop")
    for name in LOOPS:
        s, r = result["step_s"][name], result["ratio_to_simple"][name]
        posts = result["posts"].get(name)
        extra = (
            f"; posts accepted {posts['accepted']}, failed {posts['failed']}, replaced unsent "
            f"{posts['replaced']}"
            if posts
            else ""
        )
        print(
            f"  {name:<20} median {s['median']:.3f} s/step; ratio to simple: "
            f"{harness.spread_text(r)}; ratio of step medians "
            f"{result['ratio_of_step_medians'][name]:.3f}{extra}"
        )
    d = result["direct"]
    if d:
        step = result["step_median_s"]
        print(
            f"  reporter after_step alone: {_ms(d['after_step_not_due_s']['median'])} when no "
            f"report is due ({d['after_step_not_due_s']['median'] / step:.4%} of a step), "
            f"{_ms(d['after_step_due_s']['median'])} when one is queued; one post (poster "
            f"thread: token, CA, TLS handshake, POST): {_ms(d['one_post_s']['median'])}"
        )
    if overhead.smoke_run(result):
        return
    ratio = result["ratio_to_simple"]["progress"]["median"]
    verdict = "meets" if ratio <= GOAL else "misses"
    print(f"  progress / simple median ratio {ratio:.3f} {verdict} the goal of <= {GOAL}")


def main(argv: list[str] | None = None) -> None:
    overhead.main(__doc__, run, print_report, "loop", argv)


if __name__ == "__main__":
    main()
