"""The control plane's Go builds with two sets of compile flags, side by side.

    python3.11 -m bench.go_build                    # etcd, each set once
    python3.11 -m bench.go_build helm --repeats 2   # another component, twice each

On a fresh machine the Go builds are the longest step of `make test` (docs/benchmarks.md). This
builds one pinned component the way ``cluster.build`` does (its own function, ``_build_missing``)
with each set of compile flags in turn (A, B, A, B, ...), each time with an empty Go build cache
of its own, so every package is compiled; the module sources are downloaded once before the
first timed build (``go build -n``/``go install -n`` load every package without compiling),
so no timed build waits on the network. Prints each build's wall time, its processes' CPU time
(user + system, the compiler's and linker's included) and the binaries' total size.

The sets: ``default`` (``cluster.build.COMPILE_FLAGS``, what the builds use) and ``no-dwarf``
(``-gcflags=all=-dwarf=false``: no debugging information from the compiler, which the
linker's ``-w`` drops anyway). Needs Go and the module proxy; minutes per build. Not part
of ``make bench``. Runs on the bare interpreter, as ``cluster.build`` does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.harness import children_cpu_s
from cluster import build as b

SETS: dict[str, tuple[str, ...]] = {
    "default": b.COMPILE_FLAGS,
    "no-dwarf": ("-gcflags=all=-dwarf=false",),
}


def _download(comp: b.Component, version: str, cache: Path) -> None:
    """Every module the build reads, into the shared module cache (nothing compiled)."""
    os.environ["MEGDET_CLUSTER_CACHE"] = str(cache)
    go, env = b.find_go(), b.go_env(build=True)
    work = cache / "work" / f"{comp.name}-{version}"
    work.mkdir(parents=True, exist_ok=True)
    with open(cache / "download.log", "w") as log:
        if comp.wrapper:
            b._write_wrapper(go, comp, version, work, log, env)
        for pkg in comp.binaries.values():
            if comp.wrapper:
                b._run([go, "build", "-n", "-o", os.devnull, pkg], work, log, env)
            else:
                env_install = dict(env, GOFLAGS=env["GOFLAGS"].replace("-mod=mod", "").strip())
                b._run([go, "install", "-n", f"{pkg}@{version}"], work, log, env_install)


def timed_build(comp: b.Component, version: str, flags: tuple[str, ...], cache: Path) -> dict:
    """One build into ``cache`` (its own Go build cache); wall and CPU seconds, binary bytes."""
    os.environ["MEGDET_CLUSTER_CACHE"] = str(cache)
    out = cache / "bin" / f"{comp.name}-{version}"
    cpu, start = children_cpu_s(), time.monotonic()
    b._build_missing(comp, version, out, None, lambda _: None, list(comp.binaries), flags)
    wall, cpu = time.monotonic() - start, children_cpu_s() - cpu
    size = sum(p.stat().st_size for p in out.iterdir())
    return {"wall": wall, "cpu": cpu, "bytes": size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("component", nargs="?", default="etcd", choices=sorted(b.COMPONENTS))
    parser.add_argument("--repeats", type=int, default=1, help="builds per set (default 1)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats} is not a number of builds >= 1")
    comp, version = b.COMPONENTS[args.component], b.pins()[args.component]
    if os.environ.get("GOCACHE"):
        parser.error("GOCACHE is set: each build needs an empty cache of its own; unset it")
    root = Path(tempfile.mkdtemp(prefix="megdet-go-bench-"))
    os.environ["GOMODCACHE"] = str(root / "mod")  # shared by every build, filled first
    os.environ["GOFLAGS"] = (os.environ.get("GOFLAGS", "") + " -modcacherw").strip()
    results: dict[str, list[dict]] = {name: [] for name in SETS}
    try:
        _download(comp, version, root / "download")
        for n in range(args.repeats):
            for name, flags in SETS.items():
                cache = root / f"{name}-{n}"
                row = timed_build(comp, version, flags, cache)
                results[name].append(row)
                label = f"{comp.name} {version} {name:>9} (build {n + 1})"
                print(f"{label}: {row['wall']:6.1f} s wall, {row['cpu']:6.1f} s CPU, "
                      f"{row['bytes'] / 1e6:6.1f} MB", flush=True)  # fmt: skip
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(root)], check=False)
        shutil.rmtree(root, ignore_errors=True)
    base, new = (statistics.median(r["cpu"] for r in results[k]) for k in SETS)
    base_w, new_w = (statistics.median(r["wall"] for r in results[k]) for k in SETS)
    print(f"median no-dwarf / default: CPU {new / base:.2f}x, wall {new_w / base_w:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
