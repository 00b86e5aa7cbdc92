"""Trusted weights are pinned by SHA-256: the local file iopath resolves a trusted name to is
hashed and refused before it is unpickled unless its hash is the pinned one (trainer/
weights_pin.py). The files here really run code when unpickled (they write a marker file), so
a check that let one through fails the test."""

from __future__ import annotations

import hashlib
import pickle

import pytest
from torch import nn

from megdet.trainer import weights_pin
from megdet.trainer.config import TRUSTED_WEIGHTS

R50 = "detectron2://ImageNetPretrained/MSRA/R-50.pkl"


class _RunsCode:
    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


@pytest.fixture()
def cached(tmp_path, monkeypatch):
    """A pickle that writes ``marker`` when unpickled, where iopath "downloaded" R50 to: the
    detectron2 PathManager resolves the name to it (no network)."""
    from detectron2.utils.file_io import PathManager

    marker = tmp_path / "marker"
    local = tmp_path / "iopath_cache" / "R-50.pkl"
    local.parent.mkdir()
    local.write_bytes(pickle.dumps({"model": {}, "__author__": "x", "m": _RunsCode(marker)}))
    resolved = []

    def get_local_path(path, **kwargs):
        resolved.append(path)
        return str(local) if path == R50 else path

    monkeypatch.setattr(PathManager, "get_local_path", get_local_path)
    return local, marker, resolved


def _checkpointer(tmp_path):
    from megdet.trainer.checkpoint import AtomicCheckpointer

    return AtomicCheckpointer(nn.Linear(3, 2), str(tmp_path / "out"))


def test_every_trusted_name_is_in_the_pin_table() -> None:
    assert frozenset(weights_pin.PINNED_WEIGHTS) == TRUSTED_WEIGHTS
    for name, sha in weights_pin.PINNED_WEIGHTS.items():
        assert sha is None or (len(sha) == 64 and int(sha, 16) >= 0), name


def test_a_file_with_another_hash_is_refused_before_it_is_unpickled(tmp_path, cached, monkeypatch):
    from megdet.trainer.checkpoint import UnsafeCheckpointError

    local, marker, resolved = cached
    expected = hashlib.sha256(b"the file the model zoo serves").hexdigest()
    monkeypatch.setitem(weights_pin.PINNED_WEIGHTS, R50, expected)
    ckpt = _checkpointer(tmp_path)
    with pytest.raises(UnsafeCheckpointError) as err:
        ckpt.load_weights(R50, trusted=True)
    found = hashlib.sha256(local.read_bytes()).hexdigest()
    message = str(err.value)
    assert message.startswith(f"MODEL.WEIGHTS: {R50!r} is refused: its local file {local} ")
    assert f"has SHA-256 {found}, expected {expected}" in message
    assert R50 in resolved and not marker.exists()
    # The check is all that stood in the way: pinned to its own hash, the file is unpickled.
    monkeypatch.setitem(weights_pin.PINNED_WEIGHTS, R50, found.upper())
    ckpt.load_weights(R50, trusted=True)
    assert marker.exists()


def test_a_trusted_name_with_no_pinned_hash_is_refused(tmp_path, cached, monkeypatch):
    from megdet.trainer.checkpoint import UnsafeCheckpointError

    local, marker, _ = cached
    monkeypatch.setitem(weights_pin.PINNED_WEIGHTS, R50, None)
    with pytest.raises(UnsafeCheckpointError) as err:
        _checkpointer(tmp_path).load_weights(R50, key="--weights", trusted=True)
    message = str(err.value)
    found = hashlib.sha256(local.read_bytes()).hexdigest()
    assert message.startswith(f"--weights: {R50!r} is refused: no SHA-256 is pinned for it")
    assert f"{local} (SHA-256 {found})" in message and not marker.exists()


def test_other_weights_are_not_hashed(tmp_path, monkeypatch):
    """The pin is the trusted names' only: a local state dict loads as before, unhashed."""
    import torch

    def no_hash(path):
        raise AssertionError(f"hashed {path}")

    monkeypatch.setattr(weights_pin, "sha256_of", no_hash)
    weights = tmp_path / "w.pth"
    torch.save({"model": nn.Linear(3, 2).state_dict()}, weights)
    _checkpointer(tmp_path).load_weights(str(weights))


def test_megdet_train_exits_2_naming_the_file_and_both_hashes(
    tmp_path, cached, shapes, capsys, monkeypatch
):
    from megdet.cli import main

    local, marker, _ = cached
    expected = "ab" * 32
    monkeypatch.setitem(weights_pin.PINNED_WEIGHTS, R50, expected)
    argv = ["train", "--config", "megdet_tiny_cpu", "--output", str(tmp_path / "out"),
            "--train-json", str(shapes["train_json"]),
            "--train-images", str(shapes["train_images"]), "MODEL.WEIGHTS", R50]  # fmt: skip
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    err = capsys.readouterr().err
    found = hashlib.sha256(local.read_bytes()).hexdigest()
    assert code == 2 and "Traceback" not in err, err
    assert f"megdet train: error: MODEL.WEIGHTS: {R50!r} is refused: its local file {local}" in err
    assert f"SHA-256 {found}, expected {expected}" in err
    assert not marker.exists()
