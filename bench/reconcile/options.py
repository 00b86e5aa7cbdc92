"""The controller benchmark's options: one dataclass, from which its command line is generated.

Every field of :class:`Options` is a flag of ``python -m bench.controller_reconcile``: ``--`` and
the field's name with dashes; its default is the flag's default; its help and argparse settings
are the field's metadata. A bool that defaults to False is a switch (``--paced``), one that
defaults to True can be turned off (``--no-heap-trim``). The rules between options are checked
when an Options is made, so the command line and a caller in Python get the same refusals.
"""

from __future__ import annotations

import argparse
import ctypes.util
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from megdet.controller.daemon import DEFAULT_WORKER_LIMIT

APIS = ("kmock", "cluster")
#: --preload's allocators: the library the dynamic loader finds by name, and its Debian package
PRELOADS = {"jemalloc": "libjemalloc.so.2", "mimalloc": "libmimalloc.so.2"}
PRELOAD_PACKAGES = {"jemalloc": "libjemalloc2", "mimalloc": "libmimalloc2.0"}


def _preload_present(soname: str) -> bool:
    """Whether the dynamic loader knows ``soname`` (what LD_PRELOAD will ask it for); asks
    ldconfig's cache rather than loading an allocator into this process."""
    return ctypes.util.find_library(soname.removeprefix("lib").split(".so")[0]) == soname


def _seconds_list(text: str) -> tuple[float, ...]:
    """``--rss-after-delete``'s text: seconds from 0 to 3600, separated by commas."""
    try:
        later = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        later = (-1.0,)
    if not all(0 <= x <= 3600 for x in later):
        raise ValueError(
            f"--rss-after-delete {text!r}: seconds from 0 to 3600, "
            "separated by commas (e.g. 0,15,30,60)"
        )
    return later


def _flag(
    default: Any,
    help: str,
    *,
    tuning: bool = False,
    parse: Callable[[str], Any] | None = None,
    **argparse_settings: Any,
) -> Any:
    """A field of :class:`Options` and its flag. ``tuning``: how the controller process runs
    (reported with each result); ``parse``: the flag takes text (default "") that this turns
    into the field's value, its ValueError a usage error."""
    metadata = {"help": help, "tuning": tuning, "parse": parse, "argparse": argparse_settings}
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Options:
    """One invocation of the controller benchmark (see bench/controller_reconcile.py)."""

    api: str = _flag(
        "both",
        "the API server: kmock (emulator), cluster (a real control plane) or both, "
        "side by side (default)",
        choices=(*APIS, "both"),
    )
    runs: int = _flag(200, "MegDetRuns to apply (default 200)")
    nodes: int = _flag(4, "cluster: fake 8-GPU kwok nodes (default 4)")
    namespaces: int = _flag(1, "spread the runs over this many (default 1)")
    workers: int | None = _flag(None, "kopf handler threads (default: kopf's)", type=int)
    paced: bool = _flag(
        False, "apply each run after the previous one is reconciled (latency without a queue)"
    )
    timeout: float = _flag(600, "seconds for all runs to be reconciled", type=float)
    keep_logs: Path | None = _flag(  # noqa: RUF009 - _flag returns a dataclasses.field
        None, "cluster: copy its logs (audit.log) here", type=Path
    )
    write_costs: int = _flag(
        0,
        "cluster: afterwards, time N requests of each kind a reconcile makes, alone "
        "(the API server's CPU per request; default 0: skip)",
        metavar="N",
    )
    delete: bool = _flag(
        False,
        "after the runs are reconciled, delete them all and read the controller's memory "
        "once they are gone (does it come back?)",
    )
    #: The controller's RSS (MiB) is read again these many seconds after the deletion's quiet
    #: point.
    rss_after_delete: tuple[float, ...] = _flag(
        (),
        "with --delete: also read the controller's RSS these many seconds after the "
        "deletion's quiet point, e.g. 0,15,30,60 (what an idle controller gives back later)",
        tuning=True,
        parse=_seconds_list,
        metavar="S[,S...]",
    )
    restart: bool = _flag(
        False,
        "once every run is reconciled, stop the controller and start a new one where "
        "they all exist (an upgrade, a failover): time until it has resumed every run, and "
        "its memory (not with --delete)",
    )
    tracemalloc: bool = _flag(
        False,
        "trace the controller's allocations and report the files whose memory grew most "
        "(slows it down: no timings from such a run)",
    )
    training_operator: bool = _flag(
        False,
        "cluster: run the Kubeflow training operator too (it makes the PyTorchJobs' pods "
        "on the kwok nodes) and report its CPU and API requests per job beside the "
        "controller's per run (the anchor)",
    )
    #: The heap trimmer of controller/heap.py, as ``megdet controller`` starts it.
    heap_trim: bool = _flag(
        True,
        "run the controller's heap trimmer (controller/heap.py) as `megdet controller` "
        "does (default: on; --no-heap-trim: the controller before it)",
        tuning=True,
    )
    #: glibc's ``MALLOC_ARENA_MAX`` in the controller process (0: glibc's default, 8 per core).
    arena_max: int = _flag(
        0,
        "MALLOC_ARENA_MAX for the controller process (default 0: glibc's own; the operator "
        "chart sets 2)",
        tuning=True,
        metavar="N",
    )
    #: ``PYTHONMALLOC`` in the controller process ("": Python's own small-object allocator).
    python_malloc: str = _flag(
        "",
        "PYTHONMALLOC for the controller process (default: unset, Python's pymalloc; "
        "malloc: every allocation from the C library, which the heap trimmer can give back)",
        tuning=True,
        choices=("pymalloc", "malloc"),
    )
    #: A C allocator the controller process loads first (``LD_PRELOAD``; "": glibc's).
    preload: str = _flag(
        "",
        "load this C allocator into the controller process first (LD_PRELOAD of its "
        "Debian package's library; default: glibc's malloc). Only Python's allocations that "
        "go to the C library use it: pair with --python-malloc malloc",
        tuning=True,
        choices=sorted(PRELOADS),
    )
    #: The objects of a kind whose events are processed at once once the controller is indexed
    #: (0: no limit, kopf's default).
    worker_limit: int = _flag(
        DEFAULT_WORKER_LIMIT,
        "at most N objects of a kind handled at once once the controller has listed them "
        "(megdet controller --worker-limit; the others' events wait in their queues; default: "
        f"the controller's, {DEFAULT_WORKER_LIMIT}; 0: no limit, kopf's default)",
        tuning=True,
        metavar="N",
    )
    #: kopf's ``settings.queueing.idle_timeout`` (0: the controller's, 1 s): how long an
    #: object's worker waits for its next event.
    idle_timeout: float = _flag(
        0.0,
        "kopf's settings.queueing.idle_timeout: an object's worker exits after S seconds "
        "without events (default: the controller's, 1 s; kopf's own default is 5 s)",
        tuning=True,
        metavar="S",
    )
    job_cache: bool = _flag(
        True,
        "answer the controller's job reads from its watch (controller/job_cache.py JobCache; "
        "default: on; --no-job-cache: every read asks the API server, as before)",
        tuning=True,
    )
    lean_render: bool = _flag(
        True,
        "check a run's values against the chart's schema in process and, when they pass, "
        "render the chart's copy without its schema and NOTES.txt (controller/render.py; "
        "default: on; --no-lean-render: every render runs Helm's schema check and renders the "
        "NOTES, as before)",
        tuning=True,
    )
    sample: bool = _flag(
        False,
        "sample every thread of the controller's stacks every 5 ms, ready -> reconciled, "
        "and report where its running time goes (slows it a little)",
        tuning=True,
    )
    json: bool = _flag(False, "print raw JSON")

    def __post_init__(self) -> None:
        problem = next(self._problems(), None)
        if problem is not None:
            raise ValueError(problem)

    def _problems(self) -> Iterator[str]:
        """What is wrong with these options, in the order the command line names it."""
        if self.delete and self.restart:
            yield "--delete and --restart: choose one (a restart needs the runs to exist)"
        if self.rss_after_delete and not self.delete:
            yield "--rss-after-delete needs --delete (it reads the memory once runs are gone)"
        if self.preload and not _preload_present(PRELOADS[self.preload]):
            yield (
                f"--preload {self.preload}: {PRELOADS[self.preload]} is not installed "
                f"(apt-get install {PRELOAD_PACKAGES[self.preload]})"
            )
        if self.arena_max < 0:
            yield "--arena-max must be 0 (glibc's default) or more"
        if self.worker_limit < 0:
            yield "--worker-limit must be 0 (no limit, kopf's default) or more"
        if not self.idle_timeout >= 0:
            yield "--idle-timeout must be 0 (the controller's 1 s) or more seconds"
        if self.runs < 1 or self.nodes < 1 or self.namespaces < 1:
            yield "--runs, --nodes and --namespaces must be at least 1"

    @property
    def apis(self) -> tuple[str, ...]:
        """The APIs this invocation measures, in turn (kmock first)."""
        return APIS if self.api == "both" else (self.api,)

    def tuning(self) -> dict[str, Any]:
        """How the controller process runs: the tuning fields and their values."""
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["tuning"]
        }

    @classmethod
    def parser(cls, description: str) -> argparse.ArgumentParser:
        """The command line: one flag per field."""
        parser = argparse.ArgumentParser(description=description)
        for f in dataclasses.fields(cls):
            settings = dict(f.metadata["argparse"])
            if isinstance(f.default, bool):
                settings["action"] = argparse.BooleanOptionalAction if f.default else "store_true"
            elif f.metadata["parse"] is not None:
                settings["default"] = ""
            elif "type" not in settings and "choices" not in settings:
                settings["type"] = type(f.default)
            settings.setdefault("default", f.default)
            parser.add_argument(
                "--" + f.name.replace("_", "-"), help=f.metadata["help"], **settings
            )
        return parser

    @classmethod
    def from_args(cls, argv: Sequence[str] | None, description: str) -> Options:
        """Options from a command line; a bad value exits 2 with a message naming its flag."""
        parser = cls.parser(description)
        values = vars(parser.parse_args(argv))
        try:
            for f in dataclasses.fields(cls):
                if f.metadata["parse"] is not None:
                    values[f.name] = f.metadata["parse"](values[f.name])
            return cls(**values)
        except ValueError as err:
            parser.error(str(err))
