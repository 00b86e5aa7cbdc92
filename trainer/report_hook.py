"""The hook that leaves a finished run's report in its output folder (trainer/report.py)."""

from __future__ import annotations

import logging

from detectron2.engine import hooks
from detectron2.utils import comm

from megdet.trainer.report import ReportError, build_report, write_report

logger = logging.getLogger(__name__)


class WriteReport(hooks.HookBase):
    """Rank 0 writes ``report.json`` and ``report.html`` once training has finished.

    Register it after the hooks whose output it reads: detectron2's ``EvalHook`` runs the last
    evaluation (``metrics.json``) and ``PeriodicWriter`` flushes ``events.jsonl`` in their
    ``after_train``, which runs in registration order; and before the progress reporter, whose
    final report carries the report's totals (:attr:`report`). A run that stopped early
    (SIGTERM, an error) writes no report; `megdet report` reads the folder at any time. A
    report that cannot be built or written is a warning, never a failed run.
    """

    def __init__(self, output_dir: str) -> None:
        self._output_dir = output_dir
        #: The report built at the end of training (None before, or when it could not be).
        self.report: dict | None = None

    def after_train(self) -> None:
        # detectron2's loop leaves ``iter`` at max_iter (or past it) only when it completed.
        if not comm.is_main_process() or self.trainer.iter < self.trainer.max_iter:
            return
        try:
            self.report = build_report(self._output_dir)
            written = write_report(self._output_dir, self.report)
        except (ReportError, OSError) as err:
            logger.warning("No run report written: %s", err)
            return
        logger.info("Wrote the run's report: %s", ", ".join(str(p) for p in written))
