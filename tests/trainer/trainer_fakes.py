"""What several trainer tests build: a file that runs code when unpickled, a checkpointable
holder with an AtomicCheckpointer, a one-layer model with detectron2's interface, and
``megdet`` run in process."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn


class RunsCode:
    """Unpickling this runs code: it writes ``marker``, as a malicious file would do worse."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


class Holder:
    """A checkpointable with an iteration, like the trainer."""

    def __init__(self) -> None:
        self.iteration = -1

    def state_dict(self):
        return {"iteration": self.iteration}

    def load_state_dict(self, state):
        self.iteration = state["iteration"]


def checkpointer(folder: Path):
    """(a model, its :class:`Holder`, an AtomicCheckpointer of both in ``folder``, made)."""
    from megdet.trainer.checkpoint import AtomicCheckpointer

    folder.mkdir(parents=True, exist_ok=True)
    model = nn.Linear(3, 2)
    holder = Holder()
    return model, holder, AtomicCheckpointer(model, str(folder), trainer=holder)


class LinearDetector(nn.Module):
    """A BN-free model with detectron2's interface: a batch in, ``losses`` of the one seeded
    linear layer's output (a dict of losses) out."""

    def __init__(self, losses: Callable[[torch.Tensor], Mapping[str, torch.Tensor]]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(3, 1)
        self.losses = losses

    def forward(self, batch):
        return dict(self.losses(self.body(batch)))


def run_megdet(argv: list[str], capsys: Any) -> tuple[int, str]:
    """``megdet ARGV`` in this process: its exit code and what it wrote to stderr."""
    from megdet.cli import main

    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr().err


def train_argv(output: Path, shapes: Mapping[str, Path], config: str, *overrides: str) -> list:
    """``megdet train``'s arguments on the shapes training set."""
    return ["train", "--config", str(config), "--output", str(output),
            "--train-json", str(shapes["train_json"]),
            "--train-images", str(shapes["train_images"]), *overrides]  # fmt: skip
