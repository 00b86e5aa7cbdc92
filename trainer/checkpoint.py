"""Atomic checkpoints and resuming from the last complete one.

A checkpoint is written to a temporary file in the output folder and renamed into place, so a
reader (a restarted pod on the shared volume) never sees a half-written ``model_*.pth`` under
its final name. If the newest checkpoint is nevertheless unreadable (truncated by a full disk,
copied partially), resuming skips it with a warning and takes the previous one.

Nothing is unpickled beyond tensors and plain containers: checkpoints and weights files are
read with ``torch.load(weights_only=True)`` (detectron2's seam for PyTorch files,
``DetectionCheckpointer._torch_load``), URLs and pickle files are refused (``load`` and
``_load_file``), so a file on the volume cannot run code in the trainer. A checkpoint that holds
other objects stops the run (:class:`UnsafeCheckpointError`, exit 2) instead of being skipped:
it is not a file this trainer wrote. Only weights loaded with ``trusted=True``
(``MEGDET.ALLOW_UNSAFE_WEIGHTS`` or :data:`~megdet.trainer.config.TRUSTED_WEIGHTS`) go
through detectron2's own loaders (pickle for ``.pkl``, full unpickling for PyTorch files); a
trusted name's local file (iopath's download or cache) only if its SHA-256 is the one pinned
in ``trainer/weights_pin.py``, checked before anything is unpickled; a trusted name with no
pinned hash is downloaded into a private folder instead (never from a cache).
The checkpoints the trainer writes hold tensors, ints, floats, strings, None, lists and dicts
(model and optimizer state, ``iteration``, the LR scheduler's ``base_lrs``/``last_epoch``,
the AMP scaler's numbers), all loadable weights-only without any allow-listed class.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from detectron2.checkpoint import DetectionCheckpointer

from megdet.trainer.config import ALLOWED_WEIGHTS, ConfigError, is_url, unsafe_weights_reason
from megdet.trainer.weights_pin import (
    PINNED_WEIGHTS,
    WeightsDownloadError,
    pin_problem,
    private_download,
)

logger = logging.getLogger(__name__)

_ITER_NAME = re.compile(r"^model_(\d+)\.pth$")
#: The checkpoint key of the run's state (megdet.trainer.elastic): ints, strings and lists.
RUN_STATE_KEY = "megdet_run"
_UNSAFE_GLOBAL = re.compile(r"GLOBAL (\S+) was not an allowed global")
#: How torch's weights-only unpickler (torch/_weights_only_unpickler.py) refuses an object, as
#: opposed to bytes it cannot parse (a corrupt file: skipped like a truncated one).
_REFUSED_OBJECT = re.compile(
    r"was not an allowed global|whose module \S+ is blocked|Can only create new object"
    r"|Trying to call reduce for unrecognized function|Can only build "
)


class UnsafeCheckpointError(ConfigError):
    """A checkpoint or weights file that would need full unpickling (it could run code)."""


def _unsafe_globals(path: str | os.PathLike, err: Exception) -> list[str]:
    """The classes/functions the file refers to beyond tensors (read statically, not run)."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # legacy (non-zip) format or unreadable: fall back to the error's text
        found = []
    return found or _UNSAFE_GLOBAL.findall(str(err))


def load_tensors(path: str | os.PathLike, advice: str = "") -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU.

    Raises UnsafeCheckpointError naming the file when it holds objects other than tensors and
    plain containers (their unpickling could run code); other errors (a truncated or corrupt
    file) pass through unchanged.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # From torch's weights-only unpickler: an object it refuses, or bytes it cannot parse
        # (truncation is EOFError/RuntimeError instead).
        found = _unsafe_globals(path, err)
        if not found and not _REFUSED_OBJECT.search(str(err)):
            raise
        what = f" ({', '.join(found)})" if found else ""
        raise UnsafeCheckpointError(
            f"{path}: contains non-tensor objects{what}; refusing to load it, because "
            f"unpickling them could run code from the file{advice}"
        ) from None


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class AtomicCheckpointer(DetectionCheckpointer):
    """DetectionCheckpointer whose files appear complete or not at all.

    ``on_saved`` callbacks get the path of each checkpoint once it is complete under its final
    name (the metrics exporter's last-checkpoint time).

    Loading is weights-only (see the module doc): resuming and :meth:`load` read tensors only;
    :meth:`load_weights` reads pretrained weights, with detectron2's unsafe loaders only when
    the caller trusts them.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_saved: list[Callable[[Path], None]] = []
        # Set by load_weights for one load: the key the path came from (for messages), and
        # whether the file may be loaded with detectron2's own (unsafe) loaders.
        self._weights_key = ""
        self._trusted = False
        # The trusted name (trainer/weights_pin.py) being loaded: its file's hash is checked.
        self._pinned = ""
        #: The run's state for the checkpoint of an iteration (megdet.trainer.elastic.RunState).
        self.run_state: Callable[[int], dict[str, Any]] | None = None
        # A checkpoint already read (path, data): load() takes it instead of reading it again.
        self._preloaded: tuple[str, dict[str, Any]] | None = None

    def save(self, name: str, **kwargs: Any) -> None:
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict()}
        for key, obj in self.checkpointables.items():
            data[key] = obj.state_dict()
        data.update(kwargs)
        if self.run_state is not None and "iteration" in kwargs:
            data[RUN_STATE_KEY] = self.run_state(int(kwargs["iteration"]))
        path = Path(self.save_dir) / f"{name}.pth"
        self.logger.info("Saving checkpoint to %s", path)
        _atomic_write(path, lambda f: torch.save(data, f))
        self.tag_last_checkpoint(path.name)
        for callback in self.on_saved:
            callback(path)

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        path = Path(self.save_dir) / "last_checkpoint"
        _atomic_write(path, lambda f: f.write(last_filename_basename.encode()))

    def resume_candidates(self) -> list[Path]:
        """Checkpoints in the output folder, newest first: the one ``last_checkpoint`` names
        (detectron2's own choice: the last saved), then the others by the iteration they hold
        (a run that changed size counts its iterations in another batch, so a number alone
        does not say which is newer)."""
        folder = Path(self.save_dir)
        if not folder.is_dir():
            return []
        found: list[tuple[int, Path]] = []
        for path in folder.glob("model_*.pth"):
            match = _ITER_NAME.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
            elif path.name == "model_final.pth":
                found.append((1 << 62, path))
        ordered = [p for _, p in sorted(found, reverse=True)]
        try:
            last = folder / (folder / "last_checkpoint").read_text().strip()
        except (OSError, UnicodeDecodeError):
            return ordered
        return sorted(ordered, key=lambda p: p != last)  # stable: the rest keep their order

    def load_read(self, path: Path, data: dict[str, Any]) -> dict[str, Any]:
        """``load(path)`` of a checkpoint already read into ``data`` (not read again)."""
        self._preloaded = (str(path), data)
        try:
            return self.load(str(path))
        finally:
            self._preloaded = None

    def read_latest(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest readable checkpoint and its contents (tensors only); None if there is none.

        A truncated or corrupt file is skipped with a warning. Raises UnsafeCheckpointError when
        the newest readable checkpoint holds non-tensor objects: someone put a file there that
        this trainer did not write.
        """
        advice = (
            "; the trainer's own checkpoints hold only tensors, numbers and strings: move the "
            "file out of the output folder if it is not one of this run's"
        )
        for path in self.resume_candidates():
            try:
                # Read it whole first: a truncated file fails here, before the model is touched.
                return path, load_tensors(path, advice)
            except UnsafeCheckpointError:
                raise
            except Exception as err:  # any zip/EOF error means "not a usable checkpoint"
                logger.warning(
                    "Skipping unreadable checkpoint %s (%s: %s)", path, type(err).__name__, err
                )
        return None

    def resume_latest(self) -> dict[str, Any] | None:
        """Load the newest readable checkpoint with all checkpointables; None if there is none
        (:meth:`read_latest` says which, and what it refuses)."""
        found = self.read_latest()
        if found is None:
            return None
        logger.info("Resuming from %s", found[0])
        return self.load_read(*found)

    def load_weights(self, path: str, *, key: str = "MODEL.WEIGHTS", trusted: bool = False):
        """Load pretrained/evaluated weights into the model only (no optimizer, no iteration).

        ``key`` names where ``path`` came from in errors. Without ``trusted``, URLs and pickle
        files are refused and PyTorch files are read weights-only (UnsafeCheckpointError).
        """
        self._weights_key, self._trusted = key, trusted
        try:
            if trusted and path in PINNED_WEIGHTS and PINNED_WEIGHTS[path] is None:
                # No hash to check a cached file against: never read a cache (weights_pin).
                with private_download(path) as local:
                    return self.load(str(local), checkpointables=[])
            self._pinned = path if path in PINNED_WEIGHTS else ""
            return self.load(path, checkpointables=[])
        except WeightsDownloadError as err:
            raise ConfigError(f"{key}: {err}") from None
        finally:
            self._weights_key, self._trusted, self._pinned = "", False, ""

    # --- detectron2's loading seams -------------------------------------------------------

    def _refusal(self, path: str, reason: str) -> UnsafeCheckpointError:
        key = self._weights_key or "checkpoint"
        return UnsafeCheckpointError(f"{key}: {path!r} is refused: {reason}; {ALLOWED_WEIGHTS}")

    def load(self, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        # Before DetectionCheckpointer.load, which downloads URLs (get_local_path).
        if path and not self._trusted and is_url(path):
            raise self._refusal(path, unsafe_weights_reason(path) or "a URL")
        try:
            return super().load(path, *args, **kwargs)
        except BaseException:
            # DetectionCheckpointer.load resets this only on success; a refused file would
            # leave the checkpointer unable to load anything else.
            self._parsed_url_during_load = None
            raise

    def _load_file(self, filename: str) -> dict[str, Any]:
        if self._preloaded is not None and self._preloaded[0] == filename:
            return self._preloaded[1]
        # The local file iopath resolved a trusted name to, before any loader reads it.
        if self._pinned:
            problem = pin_problem(self._pinned, filename)
            if problem:
                key = self._weights_key or "checkpoint"
                raise UnsafeCheckpointError(f"{key}: {self._pinned!r} is refused: {problem}")
        # DetectionCheckpointer._load_file unpickles .pkl files and torch.loads .pyth files
        # itself; everything else reaches _torch_load.
        if not self._trusted:
            reason = unsafe_weights_reason(filename)
            if reason:
                raise self._refusal(filename, reason)
        return super()._load_file(filename)

    def _torch_load(self, f: str) -> dict[str, Any]:
        if self._trusted:
            return torch.load(f, map_location="cpu", weights_only=False)
        if self._weights_key:
            advice = (
                f"; {self._weights_key} must hold only tensors (a state dict), or set "
                "MEGDET.ALLOW_UNSAFE_WEIGHTS True if you trust this file"
            )
        else:
            advice = ""
        return load_tensors(f, advice)
