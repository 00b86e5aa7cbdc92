"""A problem with a MegDetRun, named by the field path it is about."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["InvalidRunError", "Problem", "field_path"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a run. ``path`` is a field path such as ``spec.nccl.ib.hca``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InvalidRunError(ValueError):
    """A run that cannot be rendered; ``problems`` says why, each naming a field."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


def field_path(parts: Iterable[str | int], root: str = "spec") -> str:
    """``["nccl", "ib", "hca"]`` -> ``spec.nccl.ib.hca``; indices and dotted keys in brackets."""
    out = root
    for part in parts:
        if isinstance(part, int) or "." in part or not part:
            out += f"[{part}]"
        else:
            out += f".{part}"
    return out.lstrip(".")
