"""SIGTERM reaches the trainer through the launcher, and the trainer's exit code comes back."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from megdet.image.launcher import run_forwarding_signals
from megdet.signals import exit_status

# A stand-in for torchrun + trainer: it writes "ready", then on SIGTERM writes what it got
# (as a checkpointing trainer would) and exits with a distinctive code.
CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    def on_term(signum, frame):
        out.write_text(f"got {signal.Signals(signum).name}")
        sys.exit(43)
    signal.signal(signal.SIGTERM, on_term)
    Path(str(out) + ".ready").write_text("ready")
    time.sleep(60)
    sys.exit(0)
    """
)

# The launcher side: run_forwarding_signals in its own process, as in a pod.
LAUNCHER = textwrap.dedent(
    """
    import sys
    from megdet.image.launcher import run_forwarding_signals
    sys.exit(run_forwarding_signals([sys.executable, "-c", sys.argv[1], sys.argv[2]]))
    """
)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"launcher exited early with {proc.returncode}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_sigterm_is_forwarded_to_the_child_and_the_pod_exits_as_terminated(tmp_path):
    out = tmp_path / "child.txt"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, CHILD, str(out)])
    try:
        _wait_for(Path(str(out) + ".ready"), launcher)
        launcher.send_signal(signal.SIGTERM)
        # The launcher waited for the child's handler (it wrote the file and exited 43), then
        # reported 128 + SIGTERM: interrupted, so a restart policy retries the pod.
        assert launcher.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert out.read_text() == "got SIGTERM"


def test_without_a_signal_the_childs_exit_code_is_the_pods(tmp_path):
    # The same child, left alone, finishes with its own code.
    child = CHILD.replace("time.sleep(60)", "pass").replace("sys.exit(0)", "sys.exit(5)")
    assert run_forwarding_signals([sys.executable, "-c", child, str(tmp_path / "c")]) == 5


def test_a_signal_that_arrives_while_the_child_starts_is_delivered(tmp_path):
    # The signal handler is installed before the child exists; a SIGTERM in that window must
    # not be lost (nor kill the launcher and orphan the child).
    out = tmp_path / "child.txt"
    script = textwrap.dedent(
        f"""
        import os, signal, sys, subprocess
        from megdet.image import launcher
        real_popen = subprocess.Popen
        children = []
        def popen_after_sigterm(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)  # lands before the child exists
            children.append(real_popen(*args, **kwargs))
            return children[-1]
        launcher.subprocess.Popen = popen_after_sigterm
        code = launcher.run_forwarding_signals([sys.executable, "-c", {CHILD!r}, {str(out)!r}])
        print("child returncode", children[0].returncode)
        sys.exit(code)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], timeout=30, capture_output=True)
    # Without the pending-signal delivery the child would sleep 60 s and the run time out.
    assert result.returncode == 128 + signal.SIGTERM
    # The child really got SIGTERM: delivered right after it started, it lands before the
    # child's Python installed its handler, so it dies of it (-15); had the handler run it
    # would have exited 43 after writing its file.
    returncode = int(result.stdout.decode().split("child returncode")[1])
    assert returncode in (-signal.SIGTERM, 43)
    assert returncode == 43 or not out.exists()


def test_exit_code_of_a_failing_child_propagates():
    assert run_forwarding_signals([sys.executable, "-c", "import sys; sys.exit(7)"]) == 7
    assert run_forwarding_signals([sys.executable, "-c", "pass"]) == 0


def test_a_child_killed_by_a_signal_reports_128_plus_the_signal():
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert run_forwarding_signals([sys.executable, "-c", code]) == 128 + signal.SIGKILL
    assert exit_status(-signal.SIGTERM) == 143


def test_signal_handlers_are_restored_afterwards():
    before = signal.getsignal(signal.SIGTERM)
    run_forwarding_signals([sys.executable, "-c", "pass"])
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_child_gets_the_env_it_is_given():
    code = "import os, sys; sys.exit(0 if os.environ.get('MEGDET_T') == 'from-parent' else 3)"
    assert run_forwarding_signals([sys.executable, "-c", code], {"MEGDET_T": "from-parent"}) == 0
    assert run_forwarding_signals([sys.executable, "-c", code], {"MEGDET_T": "other"}) == 3
