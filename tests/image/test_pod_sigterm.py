"""A pod being stopped: SIGTERM to `megdet launch` reaches the trainer through torchrun, and the
trainer's checkpoint may take longer than torchrun's default 30 s, up to the pod's grace period.

torchrun passes SIGTERM on and then waits ``--shutdown-timeout`` (default
``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` = 30 s, torch/distributed/launcher/api.py) before it
SIGKILLs the trainers. The chart passes the pod's grace period as MEGDET_GRACE_PERIOD_SECONDS
and the launcher sets the timeout to that minus its margin. Here the grace period is 100 s
(timeout 90 s) and the probe makes the checkpoint write take SLOW_SAVE = 35 s: it completes. With
torchrun's default the trainer would be killed at 30 s, mid-save, and no checkpoint would exist.
"""

from __future__ import annotations

import signal

import pytest
from pod_helpers import clean_env, start_pod, stop, tiny_train_args, wait_for, with_probe

from megdet.image.topology import SHUTDOWN_MARGIN_SECONDS

# The trainer first finishes its current step (seconds here, longer on a loaded machine), then
# saves; the grace period leaves room for both.
GRACE = 100
SLOW_SAVE = 35


@pytest.mark.slow
def test_sigterm_checkpoint_slower_than_30s_completes_within_the_grace_period(tmp_path):
    # Only the SIGTERM checkpoint can appear (no periodic one; the run would take 90k iters).
    args, output = tiny_train_args(tmp_path, "SOLVER.CHECKPOINT_PERIOD", "100000")
    env = with_probe(
        {**clean_env(), "PET_NPROC_PER_NODE": "1", "MEGDET_GRACE_PERIOD_SECONDS": str(GRACE)},
        MEGDET_PROBE_SLOW_SAVE=str(SLOW_SAVE),
    )
    log = tmp_path / "pod.log"
    pod = start_pod(args, env, log)
    try:
        # Wait until the loop is running, then do what the kubelet does to the container.
        wait_for(lambda: "Starting training from iteration 0" in log.read_text(), [pod], "training")
        pod.send_signal(signal.SIGTERM)
        code = pod.wait(timeout=300)
    finally:
        stop([pod])
    text = log.read_text()
    assert f"--shutdown-timeout={GRACE - SHUTDOWN_MARGIN_SECONDS}" in text
    assert code == 128 + signal.SIGTERM, text[-3000:]
    assert "after SIGTERM" in text  # the trainer's own message: it saved, then exited
    assert "Unable to shutdown process" not in text  # torchrun did not SIGKILL it
    saved = (output / "last_checkpoint").read_text().strip()
    assert (output / saved).is_file()
