"""Free space a build needs, checked before it starts (kubeadm's preflight, for the disk).

Without the check, a build that runs out of space fails minutes in with the engine's words
only: a CI run whose machine had 21 GiB free when it ended printed ``processing tar file(write
/opt/venv/lib/python3.11/site-packages/triton/_C/libtriton.so: no space left on device)`` while
the training stage copied the build stage's venv.

Measured (docs/image.md, "Disk"): a df sampler every 2 s during a fresh clone's ``make test``
saw the free space of the cache folder's file system drop by 20.8 GiB from the start of the
``train-ci`` build to its lowest point, on a store that held the build stage already (the
training stage's ``COPY --from=build /opt/venv``: the container's copy of the 6 GB venv and the
layer committed from it; then ``podman save``'s temporary layer and the 3.3 GB archive). A
first build also makes the build stage itself, which stays in the store: 6.8 GB more. Since
the training image stays in the store too, a code change's rebuild takes the venv copy from the
cache and needs less than that; the check still asks the measured figure (the first training
build over a cached build stage makes the copy).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

__all__ = ["FREE_ENV", "GIB", "need_gib", "shortfall"]

GIB = 1 << 30
#: What a training variant's build needs free with its build stage in the store, in GiB: the
#: 20.8 GiB measured, rounded up with a margin for a torch wheel that grows.
TRAIN_REBUILD_GIB = 23
#: What the build stage adds on a first build (its 6.8 GB venv and packages), in GiB.
BUILD_STAGE_GIB = 7
#: What the controller's build needs (its image is 635 MB; the base 225 MB), in GiB.
CONTROLLER_GIB = 2
#: Overrides the need, in GiB (0: no check), for a disk whose user knows better.
FREE_ENV = "MEGDET_IMAGE_MIN_FREE_GIB"


def need_gib(target: str, stage_cached: bool, env: Mapping[str, str] = os.environ) -> float:
    """The free space, in GiB, a build of the Dockerfile's ``target`` needs; raises ValueError
    for a :data:`FREE_ENV` that is not a number >= 0."""
    raw = env.get(FREE_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value >= 0:  # also NaN
            raise ValueError(f"{FREE_ENV}={raw!r}: give a number of GiB >= 0 (0: no check)")
        return value
    if target != "train":
        return CONTROLLER_GIB
    return TRAIN_REBUILD_GIB + (0 if stage_cached else BUILD_STAGE_GIB)


def shortfall(path: Path, need: float, what: str) -> str | None:
    """Why ``what`` cannot start for lack of space on ``path``'s file system, or None."""
    if need <= 0:
        return None
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / GIB
    if free >= need:
        return None
    return (
        f"{what} needs about {need:g} GiB free on the file system of {path}, which has "
        f'{free:.1f} GiB free (docs/image.md, "Disk"). Free some (scripts/disk_report.sh '
        f"lists what the test suite's caches hold), point MEGDET_IMAGE_CACHE at a larger disk, "
        f"or set {FREE_ENV} to the GiB to require (0: no check)"
    )
