"""Atomic checkpoints and resuming from the last complete one.

A checkpoint is written to a temporary file in the output folder and renamed into place, so a
reader (a restarted pod on the shared volume) never sees a half-written ``model_*.pth`` under
its final name. If the newest checkpoint is nevertheless unreadable (truncated by a full disk,
copied partially), resuming skips it with a warning and takes the previous one.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from detectron2.checkpoint import DetectionCheckpointer

logger = logging.getLogger(__name__)

_ITER_NAME = re.compile(r"^model_(\d+)\.pth$")


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
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_saved: list[Callable[[Path], None]] = []

    def save(self, name: str, **kwargs: Any) -> None:
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict()}
        for key, obj in self.checkpointables.items():
            data[key] = obj.state_dict()
        data.update(kwargs)
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
        """Checkpoints in the output folder, newest first (by the iteration they hold)."""
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
        return [p for _, p in sorted(found, reverse=True)]

    def resume_latest(self) -> dict[str, Any] | None:
        """Load the newest readable checkpoint with all checkpointables; None if there is none."""
        for path in self.resume_candidates():
            try:
                # Read it whole first: a truncated file fails here, before the model is touched.
                torch.load(path, map_location="cpu", weights_only=False)
            except Exception as err:  # any unpickling/zip error means "not a usable checkpoint"
                logger.warning(
                    "Skipping unreadable checkpoint %s (%s: %s)", path, type(err).__name__, err
                )
                continue
            logger.info("Resuming from %s", path)
            return self.load(str(path))
        return None
