"""NCCL's debug log: the line format NCCL writes, where the launcher sends it, and the echo.

NCCL falls back from InfiniBand to TCP sockets without a warning; only its INFO lines say which
network a communicator uses. ``megdet launch`` therefore sends NCCL's INFO lines of the INIT and
NET subsystems to one file per process (:func:`with_fabric_log`), each rank reads its own file
for the fabric report (``megdet.trainer.fabric``), and the launcher copies the lines the pod's
own ``NCCL_DEBUG`` level would have printed (WARN, the version) to its stdout (:class:`LogEcho`),
so the pod log shows what it showed before. Standard library only.

The format, as read in NVIDIA/nccl at tag v2.30.7-1 (commit 73cf112295c3), ``src/debug.cc``,
``ncclDebugLogV``; the same INFO prefix since at least v2.21.5-1:

* An optional timestamp (strftime of ``NCCL_DEBUG_TIMESTAMP_FORMAT``, default ``"[%F %T] "``),
  only for the levels in ``NCCL_DEBUG_TIMESTAMP_LEVELS`` (default: WARN only).
* ``"%s:%d:%d "``: hostname, pid, tid (every level but VERSION).
* INFO: ``"[%d] NCCL INFO %s\\n"`` (cudaDev, message). WARN: a leading ``"\\n"``, then
  ``"[%d] %s:%d (%s) NCCL WARN %s\\n"`` (cudaDev, file, line, function, message; without
  ``" (%s)"`` when the function is unknown). VERSION: the message alone; ``src/init.cc``
  ``showVersion`` logs ``"NCCL version <x.y.z>+cuda<m.n>"`` at VERSION when ``NCCL_DEBUG`` is
  VERSION or WARN, as an INFO line otherwise.
* ``NCCL_DEBUG_FILE``: opened (mode "w", line-buffered) only when ``NCCL_DEBUG`` is above
  VERSION; ``%h`` becomes the hostname (``src/misc/utils.cc`` ``getHostName``: cut at the first
  ``.``; ``getHostNameForLog`` replaces ``%`` and ``/`` with ``-``), ``%p`` the pid, ``%%`` a
  ``%``; any other ``%x`` stays. Without the variable (or if the file cannot be opened) the
  lines go to stdout.
* Levels (``src/include/nccl_common.h``): VERSION 1 < WARN 2 < INFO 3 < ABORT 4 < TRACE 5.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

__all__ = [
    "ECHO_ENV",
    "FABRIC_SUBSYS",
    "QUIET_LEVELS",
    "LogEcho",
    "NcclLine",
    "debug_file_path",
    "default_log_dir",
    "echo_wanted",
    "log_hostname",
    "parse_line",
    "with_fabric_log",
]

#: The levels that print no INFO line: the launcher may send INFO to a file and echo these.
QUIET_LEVELS = ("", "VERSION", "WARN")
#: The subsystems whose INFO lines name the network (``src/init.cc`` logs "Using network %s"
#: under INIT; the transports' "NET/IB : Using ..." lines under INIT|NET).
FABRIC_SUBSYS = "INIT,NET"
#: Set by the launcher when it redirected NCCL's log: the level the pod asked for, whose lines
#: the launcher echoes to its stdout.
ECHO_ENV = "MEGDET_NCCL_ECHO"
#: The per-process file name pattern, in NCCL's own placeholders.
FILE_PATTERN = "nccl.%h.%p"

# "<host>:<pid>:<tid> [<cudaDev>] NCCL INFO <message>", after an optional timestamp.
_INFO = re.compile(r"(?:^|\s)([^\s:]+):(\d+):(\d+) \[(-?\d+)\] NCCL INFO (.*)$")
_WARN = re.compile(
    r"(?:^|\s)([^\s:]+):(\d+):(\d+) \[(-?\d+)\] \S+:\d+(?: \(\S*\))? NCCL WARN (.*)$"
)
_VERSION = re.compile(r"^NCCL version \S+$")


@dataclass(frozen=True)
class NcclLine:
    """One line of NCCL's log: its level ("INFO", "WARN", "VERSION"), message, pid, the line."""

    level: str
    message: str
    pid: int | None
    text: str


def parse_line(line: str) -> NcclLine | None:
    """The NCCL INFO, WARN or VERSION line in ``line`` (None for anything else)."""
    line = line.rstrip("\r\n")
    m = _INFO.search(line)
    if m:
        return NcclLine("INFO", m.group(5), int(m.group(2)), line)
    m = _WARN.search(line)
    if m:
        return NcclLine("WARN", m.group(5), int(m.group(2)), line)
    if _VERSION.match(line):
        return NcclLine("VERSION", line, None, line)
    return None


def log_hostname(name: str | None = None) -> str:
    """The hostname as NCCL writes it into log lines and ``%h`` (see the module doc)."""
    name = socket.gethostname() if name is None else name
    return name.split(".", 1)[0].replace("%", "-").replace("/", "-")


def debug_file_path(pattern: str, hostname: str, pid: int) -> str:
    """``NCCL_DEBUG_FILE`` expanded as NCCL expands it (``%h``, ``%p``, ``%%``)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        i += 1
        if c != "%":
            out.append(c)
            continue
        if i >= len(pattern):  # NCCL reads the terminating NUL: the "%" stays
            out.append("%")
            break
        code = pattern[i]
        i += 1
        out.append({"%": "%", "h": hostname, "p": str(pid)}.get(code, "%" + code))
    return "".join(out)


def default_log_dir() -> Path:
    """Where the launcher has NCCL write its per-process files (``/tmp/megdet-nccl``)."""
    return Path(tempfile.gettempdir()) / "megdet-nccl"


def with_fabric_log(
    env: Mapping[str, str], log_dir: Path | None = None
) -> tuple[dict[str, str], str | None]:
    """``env`` with NCCL's INIT,NET INFO lines sent to a file per process, and a line saying so.

    Only when the pod's level prints no INFO line (``NCCL_DEBUG`` unset, VERSION or WARN) and
    ``NCCL_DEBUG_FILE`` is unset: a pod that asks for INFO or TRACE keeps its lines in the pod
    log, and a file the pod names is its own (the trainer reads it all the same). The level
    asked for goes into :data:`ECHO_ENV`: :class:`LogEcho` prints those lines as before.
    """
    level = env.get("NCCL_DEBUG", "").strip().upper()
    if env.get("NCCL_DEBUG_FILE", "").strip() or level not in QUIET_LEVELS:
        return dict(env), None
    folder = default_log_dir() if log_dir is None else log_dir
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return dict(env), f"NCCL's init log stays off: cannot create {folder} ({err.strerror})"
    added = {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": FABRIC_SUBSYS,
        "NCCL_DEBUG_FILE": str(folder / FILE_PATTERN),
        ECHO_ENV: level or "WARN",
    }
    note = (
        f"NCCL's {FABRIC_SUBSYS} INFO lines go to {added['NCCL_DEBUG_FILE']} (the fabric "
        f"report); its {level or 'WARN'}-level lines are copied here"
    )
    return {**env, **added}, note


def echo_wanted(line: NcclLine, level: str) -> str | None:
    """The text to print for ``line`` when the pod asked for ``level``; None to skip it."""
    if line.level == "VERSION" or (line.level == "INFO" and _VERSION.match(line.message)):
        return line.message  # NCCL prints the version bare at VERSION and WARN
    if line.level == "WARN" and level == "WARN":
        return line.text
    return None


class LogEcho:
    """Copies the lines of ``level`` from every NCCL file in ``folder`` to ``out``.

    Files already there when it starts are read from their end. :meth:`poll` reads what was
    appended since (complete lines only); a daemon thread polls every ``interval`` seconds
    between :meth:`start` and :meth:`stop`, which polls a last time.
    """

    def __init__(
        self, folder: Path, level: str, out: TextIO | None = None, interval: float = 1.0
    ) -> None:
        self.folder = folder
        self.level = level
        self.out = out
        self.interval = interval
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, bytes] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        for path in self._files():
            self._offsets[path.name] = _size(path)

    def _files(self) -> list[Path]:
        try:
            return sorted(p for p in self.folder.iterdir() if p.name.startswith("nccl."))
        except OSError:
            return []

    def poll(self) -> int:
        """Echo what was appended since the last poll; returns the lines printed."""
        printed = 0
        with self._lock:
            for path in self._files():
                for raw in self._new_lines(path):
                    parsed = parse_line(raw.decode("utf-8", "replace"))
                    text = None if parsed is None else echo_wanted(parsed, self.level)
                    if text is not None:
                        print(text, file=self.out or sys.stdout, flush=True)
                        printed += 1
        return printed

    def _new_lines(self, path: Path) -> Iterable[bytes]:
        start = self._offsets.get(path.name, 0)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
        except OSError:
            return []
        self._offsets[path.name] = start + len(data)
        data = self._partial.pop(path.name, b"") + data
        *lines, rest = data.split(b"\n")
        if rest:
            self._partial[path.name] = rest
        return lines

    def start(self) -> LogEcho:
        self._thread = threading.Thread(target=self._run, name="megdet-nccl-echo", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.poll()

    def __enter__(self) -> LogEcho:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
