"""controller/heap.py: when the controller hands its freed heap back to the operating system."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest

from megdet.controller.heap import HeapTrimmer, find_trim, rss_bytes

MIB = 2**20


class Process:
    """A fake process: its clock, CPU time and RSS, moved by the test; trims recorded."""

    def __init__(self) -> None:
        self.now, self.cpu, self.rss = 0.0, 0.0, 200 * MIB
        self.trims = 0
        self.freed = 0

    def trim(self) -> None:
        self.trims += 1
        self.rss -= self.freed
        self.freed = 0

    def trimmer(self, **kw) -> HeapTrimmer:
        return HeapTrimmer(
            2.0,
            trim=self.trim,
            rss=lambda: self.rss,
            cpu=lambda: self.cpu,
            clock=lambda: self.now,
            **kw,
        )

    def tick(self, seconds: float, cpu: float, grow_mib: float = 0, freed_mib: float = 0):
        self.now += seconds
        self.cpu += cpu
        self.rss += int(grow_mib * MIB)
        self.freed += int(freed_mib * MIB)


def test_trims_once_when_a_burst_is_over() -> None:
    p = Process()
    t = p.trimmer()
    for _ in range(5):  # a burst: busy, the RSS grows a little each tick
        p.tick(2, 1.8, grow_mib=4, freed_mib=3)
        assert t.check() is None
    p.tick(2, 0.01)  # quiet
    assert t.check() == "idle"
    assert p.trims == 1 and p.rss == 200 * MIB + 5 * MIB
    assert t.stats.idle == 1 and t.stats.released_bytes == 15 * MIB
    kinds = []
    for _ in range(30):  # still quiet: one more trim once the idle connections have closed
        p.tick(2, 0.01)
        kinds.append(t.check())
    assert kinds[9] == "settle" and kinds.count("settle") == 1  # 20 s after the idle trim
    assert kinds.count(None) == 29 and p.trims == 2 and t.stats.settle == 1


def test_the_settle_trim_returns_what_closed_connections_freed_and_waits_for_quiet() -> None:
    p = Process()
    t = p.trimmer(settle_s=20)
    p.tick(4, 3.0, grow_mib=50)  # a burst: 3 s of CPU
    assert t.check() is None
    p.tick(2, 0.01)
    assert t.check() == "idle"
    p.tick(16, 0.02, freed_mib=24)  # the pool's idle connections close, 15 s after their use
    assert t.check() is None  # 18 s: not yet
    p.tick(4, 1.5)  # busy again at 22 s: no settle trim while busy
    assert t.check() is None and p.trims == 1
    p.tick(2, 0.01)
    assert t.check() == "settle" and p.rss == 200 * MIB + 50 * MIB - 24 * MIB
    p.tick(40, 0.05)
    assert t.check() is None and p.trims == 2


def test_no_settle_trim_when_turned_off() -> None:
    p = Process()
    t = p.trimmer(settle_s=0)
    p.tick(4, 3.0)
    assert t.check() is None
    p.tick(2, 0.01)
    assert t.check() == "idle"
    for _ in range(30):
        p.tick(2, 0.01)
        assert t.check() is None


def test_an_idle_controller_is_not_trimmed_for_its_background_work() -> None:
    p = Process()
    t = p.trimmer()
    for _ in range(50):  # 100 s at 1 % of a core: 1 s of CPU, under min_work_s
        p.tick(2, 0.02)
        assert t.check() is None
    assert p.trims == 0


def test_trims_while_busy_when_the_rss_grows_and_not_more_often_than_min_gap() -> None:
    p = Process()
    t = p.trimmer(growth_mib=32, min_gap_s=10)
    kinds = []
    for _ in range(20):  # 40 s busy, +20 MiB per tick
        p.tick(2, 1.9, grow_mib=20, freed_mib=10)
        kinds.append(t.check())
    busy = [i for i, k in enumerate(kinds) if k == "busy"]
    assert busy and all(k in (None, "busy") for k in kinds)
    assert all(b - a >= 5 for a, b in itertools.pairwise(busy))  # >= 10 s apart
    assert t.stats.busy == len(busy) == p.trims


def test_without_malloc_trim_it_does_nothing() -> None:
    t = HeapTrimmer(2.0, trim=None)
    t._trim = None  # as on a C library without malloc_trim
    assert not t.available
    assert t.check() is None
    assert t.start()._thread is None


def test_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        HeapTrimmer(0)


def test_glibc_trim_and_rss_on_this_machine() -> None:
    found = find_trim()
    if found is None:
        pytest.skip("this C library has no malloc_trim")
    _, trim = found
    assert rss_bytes() > 0
    blocks = [bytearray(4000) for _ in range(20000)]  # 80 MB through malloc
    del blocks[::2]
    trim()  # must not crash; the RSS after it is the benchmark's business
    assert rss_bytes() > 0


#: The controller image's allocator (Dockerfile: LD_PRELOAD, PYTHONMALLOC=malloc); `make test`
#: installs the same Debian package on the host (scripts/install_node_packages.sh).
JEMALLOC = "libjemalloc.so.2"

_BURST = """
import json
from megdet.controller.heap import HeapTrimmer, rss_bytes
t = HeapTrimmer()
blocks = [bytearray(3000) for _ in range(40000)]  # about 120 MB of small blocks
peak = rss_bytes()
del blocks
before = rss_bytes()
t._trim()
print(json.dumps({"allocator": t.allocator, "peak": peak, "before": before,
                  "after": rss_bytes()}))
"""


def _burst(env: dict[str, str]) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _BURST],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "cannot be preloaded" not in result.stderr, (
        f"{result.stderr}\nthe host lacks jemalloc: apt-get install libjemalloc2 "
        "(scripts/install_node_packages.sh, which `make test` runs as root)"
    )
    return json.loads(result.stdout)


def test_under_jemalloc_the_trim_is_its_purge_and_gives_a_burst_back() -> None:
    """glibc's malloc_trim does nothing for jemalloc's heap: the trimmer must find and call
    jemalloc's own purge when the image preloads it."""
    r = _burst({"LD_PRELOAD": JEMALLOC, "PYTHONMALLOC": "malloc"})
    assert r["allocator"] == "jemalloc"
    assert r["peak"] - r["before"] < 60 * MIB  # jemalloc held the freed blocks ...
    assert r["before"] - r["after"] > 60 * MIB, r  # ... until the purge gave them back


def test_on_glibc_the_trim_is_malloc_trim() -> None:
    r = _burst({"LD_PRELOAD": "", "PYTHONMALLOC": "malloc"})
    assert r["allocator"] == "glibc"
    assert r["before"] - r["after"] > 60 * MIB, r
