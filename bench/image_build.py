"""`make image` build times: first build, rebuild after a code change, cache hit (one variant).

    .venv/bin/python -m bench.image_build controller          # with the shared engine cache
    .venv/bin/python -m bench.image_build controller --cold   # a fresh cache: base + every layer
    .venv/bin/python -m bench.image_build train-ci

Builds from a copy of the build context in a temporary folder (so edits others make to the
work tree do not change the inputs mid-run), into a temporary output folder:

1. ``first``: ``build(variant)`` as the tree is (cold with ``--cold``: a fresh
   ``MEGDET_IMAGE_CACHE``, so mmdebstrap and every layer run; else whatever the engine's layer
   cache already holds);
2. ``code change``: one line appended to ``megdet/__init__.py`` of the copy, built again (a new
   inputs digest; the engine reuses every layer before the project's own);
3. ``cache hit``: the same inputs again (the archive exists: no engine call);
4. ``code change, image not in the store``: the training image untagged and the store pruned
   first (what the builder did until it kept the image: the venv copy is made again), then one
   more line appended and built. Rows 2 and 4 are the same change with and without the
   previous image's layers, side by side.

The store's size (``du`` of the engine's store folder) is printed after each row.

Not part of ``make bench`` (minutes to tens of minutes, several GB of disk). Prints the wall
clock of each, the archive size and the image's unpacked size (``podman image inspect``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from imagebuild import build as b


def copy_context(dest: Path) -> Path:
    """The Dockerfile, .dockerignore and the build context's files, copied to ``dest``."""
    for rel in ["Dockerfile", ".dockerignore", *b.context_files(b.ROOT)]:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(b.ROOT / rel, target)
    return dest


def unpacked_bytes(ref: str) -> int:
    out = subprocess.run(
        ["podman", "image", "inspect", ref],
        env=b.engine_env(b.cache_dir()),
        capture_output=True,
        text=True,
        check=True,
    )
    return int(json.loads(out.stdout)[0]["Size"])


def store_bytes() -> int:
    out = subprocess.run(
        ["du", "-sb", str(b.cache_dir() / "storage")], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[0])


def timed(variant: str, root: Path, output: Path) -> tuple[float, Path, int]:
    start = time.monotonic()
    archive = b.build(variant, root=root, output=output)
    return time.monotonic() - start, archive, store_bytes()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variant", choices=list(b.VARIANTS))
    parser.add_argument("--cold", action="store_true", help="a fresh engine cache and base")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="megdet-bench-image-") as tmp:
        work = Path(tmp)
        if args.cold:
            os.environ["MEGDET_IMAGE_CACHE"] = str(work / "cache")
        root = copy_context(work / "context")
        output = work / "out"
        rows = []
        seconds, archive, store = timed(args.variant, root, output)
        rows.append(("first" + (" (cold)" if args.cold else ""), seconds, archive, store))
        init = root / "megdet" / "__init__.py"
        init.write_text(init.read_text() + "# bench: a code change\n")
        seconds, archive, store = timed(args.variant, root, output)
        rows.append(("code change", seconds, archive, store))
        seconds, archive, store = timed(args.variant, root, output)
        rows.append(("cache hit", seconds, archive, store))
        env = b.engine_env(b.cache_dir())
        tag = b.describe(archive)["ref"]
        subprocess.run(["podman", "untag", tag], check=True, env=env)
        b.prune_store(env)
        init.write_text(init.read_text() + "# bench: another code change\n")
        seconds, archive, store = timed(args.variant, root, output)
        rows.append(("code change, image not in the store", seconds, archive, store))
        info = b.describe(archive)
        size = unpacked_bytes(info["ref"])
        print(f"\n{args.variant}: {info['ref']}, archive {info['archive_bytes'] / 1e6:.0f} MB")
        print(f"unpacked {size / 1e6:.0f} MB")
        print("| build | wall clock | vs first | store after |")
        print("| --- | --- | --- | --- |")
        for name, secs, _, store in rows:
            print(f"| {name} | {secs:.1f} s | {secs / rows[0][1]:.3f} | {store / 1e9:.1f} GB |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
