"""Reports the run's progress to Kubeflow Trainer's status server (or the MegDet controller's).

:class:`ProgressReporter` is a detectron2 hook on rank 0, built by :func:`build_progress_hook`
only when ``KUBEFLOW_TRAINER_SERVER_URL`` is set (Trainer v2.3's ``TrainJobStatus`` plugin sets
it, and the run chart does for ``target: pytorchjob``). It turns what the loop already knows
into a :class:`megdet.progress.Progress`: the iteration and the plan's ``max_iter`` and global
batch; images/s and the ETA from a moving window of wall-clock step times; the last
evaluation's AP/AP50 from the event storage (``bbox/AP``, ``bbox/AP50``: what ``EvalHook``
puts there and the Prometheus exporter reads); the last complete checkpoint from the
checkpointer's ``on_saved`` callbacks (or, on resume, the checkpoint it resumed from); the
run's fabric (``megdet.trainer.fabric.run_report``), which the controller turns into the run's
``FabricDegraded`` condition; and where this attempt is (``megdet.progress.STAGES``), which the
controller turns into the run's lifecycle conditions: :meth:`ProgressReporter.loading` as soon
as the world has formed (before the model and data are built), ``firstIteration`` when they
are ready, ``training`` after the first iteration, :meth:`ProgressReporter.evaluating` before
each evaluation, ``finished`` at the end, with the run's totals from its report (attempts,
wall time by part: ``megdet.trainer.report.report_totals``).

Posting never touches the training thread: the hook puts the newest report into a one-slot
mailbox and a daemon thread (:class:`ProgressPoster`) POSTs it (TLS verified against the CA
file, the bearer token re-read from its file for every post, 5 s connect/read timeout). At
most one report every ``MEGDET_PROGRESS_INTERVAL`` seconds (default 30), plus one at each
stage (the resumed iteration on resume), one right after each evaluation and checkpoint and
one at the end, which ``after_train`` waits for at most 5 s. Failures are logged once per kind
(token file, CA file, TLS, connection, each HTTP status) and never raised.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from detectron2.engine import hooks
from detectron2.utils import comm

from megdet.fabric_report import FabricReport
from megdet.plan import Plan
from megdet.progress import ENV_CA_CERT, ENV_TOKEN, ENV_URL, Progress, format_time, to_request
from megdet.trainer.config import ConfigError
from megdet.trainer.report import report_totals

logger = logging.getLogger(__name__)

#: Seconds between two periodic reports (evaluations, checkpoints and the end report at once).
ENV_INTERVAL = "MEGDET_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 30.0
#: Socket timeout of one post (connect, and each read).
POST_TIMEOUT = 5.0
#: How long ``after_train`` waits for the last report to go out.
FLUSH_TIMEOUT = 5.0
#: Steps in the moving window for images/s and the ETA.
RATE_WINDOW = 50
#: The event-storage keys of the box AP that EvalHook stores (megdet.trainer.evaluation).
AP_KEY, AP50_KEY = "bbox/AP", "bbox/AP50"


def progress_interval(env: Mapping[str, str] = os.environ) -> float:
    """``MEGDET_PROGRESS_INTERVAL`` in seconds (default 30); ConfigError naming it if invalid."""
    raw = env.get(ENV_INTERVAL, "").strip()
    if not raw:
        return DEFAULT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"{ENV_INTERVAL}: {raw!r} is not a number of seconds >= 0 (default "
            f"{DEFAULT_INTERVAL:g}; 0 reports after every iteration)"
        )
    return value


class ProgressPoster:
    """POSTs reports from a daemon thread; the newest report replaces one not yet sent.

    ``submit`` never blocks on the network. Each post reads the token file and the CA file
    again (the kubelet rotates the projected token). Failures are counted and logged once per
    kind, never raised.
    """

    def __init__(
        self,
        url: str,
        ca_file: str | None,
        token_file: str | None,
        timeout: float = POST_TIMEOUT,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(f"{url!r} is not an https:// URL")
        self.url = url
        self._host = parts.hostname
        self._port = parts.port or 443
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._ca_file = ca_file
        self._token_file = token_file
        self._timeout = timeout
        self._cond = threading.Condition()
        self._pending: Progress | None = None
        self._busy = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._logged: set[str] = set()
        #: Counters for tests and logs: reports posted and accepted, failed, replaced unsent.
        self.accepted = 0
        self.failed = 0
        self.replaced = 0
        self.last_error: str | None = None

    # training thread ----------------------------------------------------------------------

    def submit(self, progress: Progress) -> None:
        """Queue ``progress`` for posting (replacing any report not yet taken); never blocks
        beyond a lock the poster holds only to swap the slot."""
        with self._cond:
            if self._closing:
                return
            if self._pending is not None:
                self.replaced += 1
            self._pending = progress
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="megdet-progress", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        """Stop taking reports; wait up to ``timeout`` s for the queued one to be posted.

        Returns whether everything queued went out. A post still hanging after ``timeout`` is
        left to its daemon thread (it ends with the process).
        """
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        return self.wait_idle(timeout)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no report is queued or being posted (at most ``timeout`` s); whether so."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._pending is None and not self._busy, timeout=timeout
            )

    # poster thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closing)
                if self._pending is None:
                    return  # closing, nothing left
                progress, self._pending = self._pending, None
                self._busy = True
            try:
                self._post(progress)
            except Exception as err:  # never let the thread die on a bug
                self._fail("internal", f"{type(err).__name__}: {err}")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _post(self, progress: Progress) -> None:
        body = json.dumps(to_request(progress)).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token_file:
            try:
                token = Path(self._token_file).read_text().strip()
            except OSError as err:
                self._fail("token", f"cannot read the token file {self._token_file}: {err}")
                return
            headers["Authorization"] = f"Bearer {token}"
        try:
            context = ssl.create_default_context(cafile=self._ca_file)
        except (OSError, ssl.SSLError) as err:
            self._fail("ca", f"cannot load the CA file {self._ca_file}: {err}")
            return
        conn = http.client.HTTPSConnection(
            self._host, self._port, timeout=self._timeout, context=context
        )
        try:
            conn.request("POST", self._path, body=body, headers=headers)
            response = conn.getresponse()
            status, detail = response.status, response.read(2048)
        except ssl.SSLError as err:
            self._fail("tls", f"TLS with {self._host}:{self._port} failed: {err}")
            return
        except (OSError, http.client.HTTPException) as err:
            self._fail("connection", f"{type(err).__name__}: {err}")
            return
        finally:
            conn.close()
        if 200 <= status < 300:
            if not self.accepted:
                logger.info("Progress reports go to %s (first one accepted)", self.url)
            self.accepted += 1
            return
        message = _status_message(detail)
        self._fail(f"HTTP {status}", f"HTTP {status}{': ' + message if message else ''}")

    def _fail(self, kind: str, message: str) -> None:
        self.failed += 1
        self.last_error = message
        if kind in self._logged:
            return
        self._logged.add(kind)
        logger.warning(
            "Progress report to %s failed: %s (training goes on; further failures of this "
            "kind are not logged)",
            self.url,
            message,
        )


def _status_message(detail: bytes) -> str:
    """The message of a Kubernetes Status answer, or the start of the body."""
    text = detail.decode("utf-8", "replace")
    try:
        data = json.loads(text)
        if isinstance(data, dict) and isinstance(data.get("message"), str):
            return data["message"][:200]
    except ValueError:
        pass
    return text.strip()[:200]


class ProgressReporter(hooks.HookBase):
    """Builds a :class:`Progress` from the loop and hands it to a :class:`ProgressPoster`.

    Register after the hooks whose results it reports (PeriodicCheckpointer, EvalHook): it
    reads their outcome in the same step. ``clock`` (monotonic) and ``wall`` (POSIX time)
    are seams for tests.
    """

    def __init__(
        self,
        poster: ProgressPoster,
        plan: Plan,
        checkpointer: Any = None,  # AtomicCheckpointer
        interval: float = DEFAULT_INTERVAL,
        flush_timeout: float = FLUSH_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        fabric: FabricReport | None = None,
    ) -> None:
        self.poster = poster
        self._fabric = fabric
        self._max_iter = plan.max_iter
        self._global_batch = plan.global_batch
        # A run that resumed on another world counts its iterations in this world's batch from
        # where the images it had seen place it (megdet.plan.plan_continuation).
        self._images_at = plan.images_at
        self._checkpointer = checkpointer
        self._interval = interval
        self._flush_timeout = flush_timeout
        self._clock = clock
        self._wall = wall
        self._samples: deque[tuple[float, int]] = deque(maxlen=RATE_WINDOW + 1)
        self._completed = 0
        self._next_due = 0.0
        self._due_now = False
        self._eval_stamp: int | None = None
        self._ap: float | None = None
        self._ap50: float | None = None
        self._eval_iteration: int | None = None
        self._checkpoint_iteration: int | None = None
        self._checkpoint_time: str | None = None
        #: megdet.progress.STAGES: where this attempt is, since when; its start-up moments.
        self._stage: str | None = None
        self._times: dict[str, str | None] = dict.fromkeys(
            ("stage", "world", "loaded", "first_iteration")
        )
        self._report: Any = None  # trainer/report_hook.py's WriteReport
        self._totals: dict[str, float] | None = None

    def attach(self, checkpointer: Any, fabric: FabricReport | None, report: Any = None) -> None:
        """The checkpointer, the fabric and the run's report hook (its ``report`` once training
        finished: the final report's totals), once the trainer is built (the reporter may be
        made before, to report the ``loading`` stage)."""
        self._checkpointer = checkpointer
        self._fabric = fabric
        self._report = report

    def _enter(self, stage: str, moment: str | None = None) -> None:
        self._stage = stage
        self._times["stage"] = format_time(self._wall())
        if moment is not None:
            self._times[moment] = self._times["stage"]
        self._due_now = True

    def loading(self) -> None:
        """The world has formed (this attempt's rendezvous is done): report ``loading`` now,
        before the model, the data and the checkpoint are loaded."""
        self._enter("loading", "world")
        self._submit()

    def evaluating(self) -> None:
        """An evaluation starts: report it now (the next step's report says ``training``)."""
        self._enter("evaluating")
        self._submit()

    # what the loop knows ----------------------------------------------------------------

    def snapshot(self, final: bool = False) -> Progress:
        """The progress now (``final``: training ended, so no rate to extrapolate from)."""
        done = self._completed
        rate = None
        if len(self._samples) >= 2:
            (t0, i0), (t1, i1) = self._samples[0], self._samples[-1]
            if t1 > t0 and i1 > i0:
                rate = (i1 - i0) / (t1 - t0)
        left = max(self._max_iter - done, 0)
        if left == 0:
            eta = 0
        elif rate and not final:
            eta = min(round(left / rate), 2**31 - 1)
        else:
            eta = None
        return Progress(
            iteration=done,
            max_iter=self._max_iter,
            images_seen=self._images_at(done),
            planned_images=self._images_at(self._max_iter),
            images_per_second=None if rate is None else rate * self._global_batch,
            eta_seconds=eta,
            ap=self._ap,
            ap50=self._ap50,
            eval_iteration=self._eval_iteration,
            checkpoint_iteration=self._checkpoint_iteration,
            checkpoint_time=self._checkpoint_time,
            updated_time=format_time(self._wall()),
            fabric=self._fabric,
            stage=self._stage,
            stage_time=self._times["stage"],
            world_time=self._times["world"],
            loaded_time=self._times["loaded"],
            first_iteration_time=self._times["first_iteration"],
            totals=self._totals,
        )

    def _read_eval(self) -> bool:
        """Take a new evaluation result from the event storage; whether there was one."""
        latest = self.trainer.storage.latest()
        ap = latest.get(AP_KEY)
        if ap is None or ap[1] == self._eval_stamp:
            return False
        self._eval_stamp = ap[1]
        ap50 = latest.get(AP50_KEY)
        self._ap = _finite(ap[0])
        self._ap50 = _finite(ap50[0]) if ap50 is not None else None
        # Stored at the step's 0-based iteration: that many + 1 iterations were done.
        self._eval_iteration = min(ap[1] + 1, self._max_iter)
        return True

    def _checkpoint_saved(self, path: Path) -> None:
        self._checkpoint_iteration = min(self.trainer.iter + 1, self._max_iter)
        self._checkpoint_time = format_time(self._wall())
        # StopOnSignal saves in its after_step and stops before this hook's after_step runs.
        self._completed = max(self._completed, self._checkpoint_iteration)
        self._due_now = True

    def _resumed_checkpoint(self, start: int) -> None:
        self._checkpoint_iteration = start
        folder = Path(getattr(self._checkpointer, "save_dir", "") or ".")
        path = folder / f"model_{start - 1:07d}.pth"
        if not path.is_file():
            last = self._checkpointer.get_checkpoint_file()
            path = Path(last) if last else path
        try:
            self._checkpoint_time = format_time(path.stat().st_mtime)
        except OSError:
            self._checkpoint_time = None

    def _submit(self, final: bool = False) -> None:
        self.poster.submit(self.snapshot(final))
        self._next_due = self._clock() + self._interval
        self._due_now = False

    # hooks --------------------------------------------------------------------------------

    def before_train(self) -> None:
        start = self.trainer.start_iter
        self._completed = start
        self._samples.append((self._clock(), start))
        self._enter("firstIteration", "loaded")
        if self._checkpointer is not None:
            if start > 0:
                self._resumed_checkpoint(start)
            self._checkpointer.on_saved.append(self._checkpoint_saved)
        self._submit()

    def after_step(self) -> None:
        done = self.trainer.iter + 1
        self._completed = done
        now = self._clock()
        self._samples.append((now, done))
        if self._stage in ("firstIteration", "evaluating"):
            self._enter("training", None if self._times["first_iteration"] else "first_iteration")
        if self._read_eval() or self._due_now or now >= self._next_due:
            self._submit()

    def after_train(self) -> None:
        if self._checkpointer is not None:
            callbacks = self._checkpointer.on_saved
            if self._checkpoint_saved in callbacks:
                callbacks.remove(self._checkpoint_saved)
        self._read_eval()  # EvalHook.after_train (the final evaluation) ran before this hook
        if self._completed >= self._max_iter:  # not a stop on a signal
            self._enter("finished")
            built = getattr(self._report, "report", None)  # WriteReport ran just before
            self._totals = report_totals(built) if built else None
        self._submit(final=True)
        if not self.poster.flush(self._flush_timeout):
            logger.warning(
                "The last progress report to %s did not go out within %g s; not waiting",
                self.poster.url,
                self._flush_timeout,
            )


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def build_progress_hook(
    plan: Any,
    checkpointer: Any = None,
    env: Mapping[str, str] = os.environ,
    fabric: FabricReport | None = None,
) -> ProgressReporter | None:
    """The progress reporter on rank 0 when ``KUBEFLOW_TRAINER_SERVER_URL`` is set, else None.

    Call on every rank: ``MEGDET_PROGRESS_INTERVAL`` is checked everywhere (ConfigError naming
    it, so all ranks stop with exit 2 together). A URL that is not https:// turns reporting off
    with a warning instead: progress is never worth stopping a run for.
    """
    interval = progress_interval(env)
    url = env.get(ENV_URL, "").strip()
    if not url or not comm.is_main_process():
        return None
    try:
        poster = ProgressPoster(url, env.get(ENV_CA_CERT) or None, env.get(ENV_TOKEN) or None)
    except ValueError as err:
        logger.warning("%s: %s; progress reporting is off", ENV_URL, err)
        return None
    logger.info("Reporting progress to %s every %g s", url, interval)
    return ProgressReporter(poster, plan, checkpointer, interval, fabric=fabric)
