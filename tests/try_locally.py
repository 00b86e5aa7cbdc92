"""README.md's "Try it locally" commands, read from the README itself (the one copy), for the
tests that run them: tests/e2e/test_e2e_real_training.py runs them on the real node,
tests/cluster/test_local_images.py checks what they name offline.

The fenced block is read as paragraphs (blank-line separated), in order: set-up (``make``
targets and the ``export``), the storage, the run chart, the operator and a MegDetRun,
tear-down. Comment lines are dropped and continued lines joined; each command is run by bash.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
HEADING = "## Try it locally\n"
PARAGRAPHS = ("setup", "storage", "run chart", "operator", "teardown")
#: The state folder the README's commands name (`make cluster`'s); the tests' cluster is elsewhere.
STATE_WORD = "$PWD/.cluster"


def block(text: str | None = None) -> str:
    text = README.read_text() if text is None else text
    if HEADING not in text:
        raise AssertionError(f"README.md has no {HEADING.strip()!r} section")
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    return section.split("```bash\n", 1)[1].split("\n```", 1)[0]


def paragraphs(text: str | None = None) -> dict[str, list[str]]:
    """The block's commands by paragraph (PARAGRAPHS names them)."""
    groups: list[list[str]] = [[]]
    pending = ""
    for raw in block(text).splitlines():
        line = raw.strip()
        if not line:
            if groups[-1]:
                groups.append([])
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        groups[-1].append(pending + line)
        pending = ""
    groups = [g for g in groups if g]
    if len(groups) != len(PARAGRAPHS):
        raise AssertionError(
            f"README's Try it locally block has {len(groups)} paragraphs, the tests read "
            f"{len(PARAGRAPHS)} ({', '.join(PARAGRAPHS)}): {groups}"
        )
    return dict(zip(PARAGRAPHS, groups, strict=True))


def environment(state: Path) -> str:
    """The README's ``export`` line for a cluster whose state folder is ``state``."""
    (export,) = [c for c in paragraphs()["setup"] if c.startswith("export ")]
    if STATE_WORD not in export:
        raise AssertionError(f"the export line names no {STATE_WORD}: {export}")
    return export.split("#", 1)[0].strip().replace(STATE_WORD, str(state))


def _poll(stop: Callable[[], Any]) -> Any:
    try:
        return stop()
    except Exception:  # not there yet (the object, its status): go on waiting
        return None


def run(
    command: str,
    state: Path,
    timeout: float = 300,
    stop: Callable[[], Any] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run one README command with bash in the repository root, after the README's ``export``
    for ``state``. ``stop``: polled while it runs; a truthy value (a failed job, say) ends the
    command at once rather than at its own timeout. Asserts it exited 0."""
    script = f"set -eo pipefail\n{environment(state)}\n{command}\n"
    with subprocess.Popen(
        ["bash", "-c", script],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ},
        start_new_session=True,
    ) as proc:
        deadline = time.monotonic() + timeout
        reason = None
        while proc.poll() is None:
            if time.monotonic() > deadline:
                reason = f"still running after {timeout:.0f} s"
            elif stop is not None and (why := _poll(stop)):
                reason = f"stopped: {why}"
            if reason:
                os.killpg(proc.pid, 15)
                break
            time.sleep(2)
        out = proc.communicate()[0]
    done = subprocess.CompletedProcess(command, proc.returncode, out, "")
    assert reason is None and proc.returncode == 0, f"$ {command}\n{reason or ''}\n{out[-4000:]}"
    return done
