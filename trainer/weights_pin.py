"""Trusted pretrained weights: pinned by SHA-256, or downloaded privately, before unpickling.

A trusted name (:data:`PINNED_WEIGHTS`) is loaded without ``MEGDET.ALLOW_UNSAFE_WEIGHTS``
although it is a pickle from a URL. detectron2 resolves such a name through iopath, which
downloads it once into its cache (``$FVCORE_CACHE``, else ``~/.torch/iopath_cache``) and from
then on returns the cached file without looking at it again, so whoever can write that file (a
volume mounted over the cache, an earlier process) would choose what is unpickled. Hence:

- a name with a pinned hash: the local file iopath returns (cache allowed) is hashed and
  refused, before any ``pickle.load``, unless its SHA-256 is the pinned one (:func:`pin_problem`);
- a name with no pinned hash: no cache is read. The trainer downloads the name's own https URL
  (:func:`official_url`) into a folder it creates for this process (``mkdtemp``: mode 0700),
  logs the file's SHA-256 and how to pin it, loads that file and removes the folder
  (:func:`private_download`). That is the trust of a first download, with nothing planted
  beforehand able to take its place. Every process (each rank) downloads its own copy.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from detectron2.utils.file_io import Detectron2Handler

logger = logging.getLogger(__name__)

#: Each trusted MODEL.WEIGHTS name and the SHA-256 of its file (hex), or None where no
#: published hash was found: such a name is downloaded privately on every load (module doc)
#: until a hash checked against the file detectron2's model zoo serves is pinned here.
#: (detectron2's MODEL_ZOO.md publishes only an md5 prefix in the file names of its trained
#: models, none for the ImageNet backbones.)
PINNED_WEIGHTS: dict[str, str | None] = {
    "detectron2://ImageNetPretrained/MSRA/R-50.pkl": None,
}

_CHUNK = 1 << 20
#: Seconds a private download may wait on one connect or read.
DOWNLOAD_TIMEOUT_S = 60


class WeightsDownloadError(Exception):
    """A trusted name's private download failed (the message names the URL)."""


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def pin_problem(name: str, local: str | Path) -> str | None:
    """Why the local file ``local`` that iopath resolved for the pinned ``name`` must not be
    unpickled (after "<name> is refused: "), or None when its SHA-256 is the pinned one."""
    expected = str(PINNED_WEIGHTS[name])
    found = sha256_of(local)
    if found == expected.lower():
        return None
    return (
        f"its local file {local} has SHA-256 {found}, expected {expected} (PINNED_WEIGHTS in "
        "trainer/weights_pin.py): not the file the trainer trusts (a replaced download or "
        "cache), so it is not unpickled"
    )


def official_url(name: str) -> str:
    """The https URL iopath fetches the trusted ``name`` from: detectron2's
    ``Detectron2Handler`` maps ``detectron2://X`` to ``https://dl.fbaipublicfiles.com/detectron2/X``
    (detectron2/utils/file_io.py)."""
    prefix = Detectron2Handler.PREFIX
    if not name.startswith(prefix):
        raise WeightsDownloadError(f"{name!r} is not a {prefix} name")
    return Detectron2Handler.S3_DETECTRON2_PREFIX + name[len(prefix) :]


class _SameSchemeRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only within the URL's scheme: https never falls back to http."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = urljoin(req.full_url, newurl)
        if urlsplit(new).scheme != urlsplit(req.full_url).scheme:
            raise WeightsDownloadError(f"redirected to {new}, another scheme")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _download(url: str, dest: Path) -> None:
    opener = urllib.request.build_opener(_SameSchemeRedirects())
    with opener.open(url, timeout=DOWNLOAD_TIMEOUT_S) as response, open(dest, "xb") as out:
        shutil.copyfileobj(response, out, _CHUNK)


@contextmanager
def private_download(name: str) -> Iterator[Path]:
    """The unpinned trusted ``name`` downloaded from :func:`official_url` into a new folder
    only this process's user can open (mode 0700), removed on exit; its SHA-256 is logged."""
    url = official_url(name)
    try:
        folder = Path(tempfile.mkdtemp(prefix="megdet-weights-"))
    except OSError as err:
        raise WeightsDownloadError(
            f"{name!r} could not be downloaded from {url}: no private folder could be made in "
            f"{tempfile.gettempdir()} (TMPDIR): {err}"
        ) from None
    try:
        local = folder / url.rsplit("/", 1)[-1]
        try:
            _download(url, local)
        except (OSError, ValueError, http.client.HTTPException, WeightsDownloadError) as err:
            raise WeightsDownloadError(
                f"{name!r} could not be downloaded from {url}: {err}"
            ) from None
        found = sha256_of(local)
        logger.warning(
            "%s: no SHA-256 is pinned, so it was downloaded from %s into a private folder "
            "(not iopath's cache): SHA-256 %s. Once you have checked this file yourself, pin "
            "it in trainer/weights_pin.py: PINNED_WEIGHTS[%r] = %r",
            name, url, found, name, found,
        )  # fmt: skip
        yield local
    finally:
        shutil.rmtree(folder, ignore_errors=True)
