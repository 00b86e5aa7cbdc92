"""Trusted pretrained weights, pinned by SHA-256 and checked before they are unpickled.

A trusted name (:data:`PINNED_WEIGHTS`) is loaded without ``MEGDET.ALLOW_UNSAFE_WEIGHTS``
although it is a pickle from a URL: detectron2 resolves it through iopath, which downloads it
once into its cache (``$FVCORE_CACHE``, else ``~/.torch/iopath_cache``) and from then on
returns the cached file without looking at it again. So whoever can write that file (a volume
mounted over the cache, a poisoned cache) chooses what is unpickled. The checkpointer therefore
hashes the local file iopath returns and refuses it, before any ``pickle.load``, unless its
SHA-256 is the one pinned here; a trusted name with no pinned hash is refused the same way.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: Each trusted MODEL.WEIGHTS name and the SHA-256 of its file (hex), or None where no
#: published hash was found: such a name is refused until a hash checked against the file
#: detectron2's model zoo serves is pinned here. (detectron2's MODEL_ZOO.md publishes only an
#: md5 prefix in the file names of its trained models, none for the ImageNet backbones.)
PINNED_WEIGHTS: dict[str, str | None] = {
    "detectron2://ImageNetPretrained/MSRA/R-50.pkl": None,
}

_CHUNK = 1 << 20


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def pin_problem(name: str, local: str | Path) -> str | None:
    """Why the local file ``local`` that iopath resolved for the trusted ``name`` must not be
    unpickled (after "<name> is refused: "), or None when its SHA-256 is the pinned one."""
    expected = PINNED_WEIGHTS.get(name)
    found = sha256_of(local)
    if expected is None:
        return (
            f"no SHA-256 is pinned for it (PINNED_WEIGHTS in trainer/weights_pin.py), so its "
            f"local file {local} (SHA-256 {found}) cannot be checked before it is unpickled; "
            "download and check it yourself, then name the local file with "
            "MEGDET.ALLOW_UNSAFE_WEIGHTS True"
        )
    if found == expected.lower():
        return None
    return (
        f"its local file {local} has SHA-256 {found}, expected {expected} (PINNED_WEIGHTS in "
        "trainer/weights_pin.py): not the file the trainer trusts (a replaced download or "
        "cache), so it is not unpickled"
    )
