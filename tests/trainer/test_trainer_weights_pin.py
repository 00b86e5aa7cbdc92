"""Trusted weights (trainer/weights_pin.py): a pinned name's local file (iopath's download or
cache) is hashed and refused before it is unpickled unless its hash is the pinned one; a name
with no pinned hash is never read from a cache, but downloaded from its own URL into a private
folder. The planted files here really run code when unpickled (they write a marker file), so a
check that let one through fails the test."""

from __future__ import annotations

import hashlib
import http.server
import logging
import os
import pickle
import stat
import threading

import numpy as np
import pytest
from torch import nn
from trainer_fakes import RunsCode, run_megdet, train_argv

from megdet.trainer import weights_pin
from megdet.trainer.config import TRUSTED_WEIGHTS

R50 = "detectron2://ImageNetPretrained/MSRA/R-50.pkl"


@pytest.fixture()
def cached(tmp_path, monkeypatch):
    """A pickle that writes ``marker`` when unpickled, where iopath "downloaded" R50 to: the
    detectron2 PathManager resolves the name to it (no network)."""
    from detectron2.utils.file_io import PathManager

    marker = tmp_path / "marker"
    local = tmp_path / "iopath_cache" / "R-50.pkl"
    local.parent.mkdir()
    local.write_bytes(pickle.dumps({"model": {}, "__author__": "x", "m": RunsCode(marker)}))
    resolved = []

    def get_local_path(path, **kwargs):
        resolved.append(path)
        return str(local) if path == R50 else path

    monkeypatch.setattr(PathManager, "get_local_path", get_local_path)
    return local, marker, resolved


@pytest.fixture()
def own_log_handlers(monkeypatch):
    """No stream handler left by an earlier in-process ``megdet train`` (detectron2's
    setup_logger binds the stdout that test captured, since closed) on the loggers it sets up."""
    for name in ("detectron2", "fvcore", "megdet"):
        monkeypatch.setattr(logging.getLogger(name), "handlers", [])


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


@pytest.fixture()
def served(tmp_path, monkeypatch):
    """A local HTTP server serving ``served/R-50.pkl`` (safe weights for nn.Linear(3, 2)),
    which R50's official URL is mapped to; yields (folder, url, requested paths)."""
    folder = tmp_path / "served"
    folder.mkdir()
    weights = {"weight": np.full((2, 3), 7.0, np.float32), "bias": np.zeros(2, np.float32)}
    (folder / "R-50.pkl").write_bytes(pickle.dumps({"model": weights, "__author__": "test"}))
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def do_GET(self):
            requested.append(self.path)
            if self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", f"https://127.0.0.1:{port}/R-50.pkl")
                self.end_headers()
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/R-50.pkl"
    monkeypatch.setattr(weights_pin, "official_url", lambda name: url if name == R50 else "")
    monkeypatch.setitem(weights_pin.PINNED_WEIGHTS, R50, None)
    yield folder, url, requested
    server.shutdown()
    server.server_close()


def test_the_official_url_is_detectron2s_https_mapping() -> None:
    """iopath's mapping of detectron2:// (detectron2/utils/file_io.py, Detectron2Handler)."""
    assert weights_pin.official_url(R50) == (
        "https://dl.fbaipublicfiles.com/detectron2/ImageNetPretrained/MSRA/R-50.pkl"
    )
    for name in TRUSTED_WEIGHTS:
        assert weights_pin.official_url(name).startswith("https://"), name


def test_an_unpinned_name_is_downloaded_privately_not_read_from_the_cache(
    tmp_path, cached, served, monkeypatch, caplog, captured_warnings
):
    local, marker, resolved = cached
    folder, url, requested = served
    seen = []
    sha256_of = weights_pin.sha256_of

    def spy(path):
        parent = os.path.dirname(path)
        seen.append((str(path), parent, stat.S_IMODE(os.stat(parent).st_mode)))
        return sha256_of(path)

    monkeypatch.setattr(weights_pin, "sha256_of", spy)
    ckpt = _checkpointer(tmp_path)
    with captured_warnings(weights_pin.__name__):
        ckpt.load_weights(R50, trusted=True)
    # The served file is what was loaded; the planted cache file was never resolved nor run.
    assert (ckpt.model.weight == 7.0).all() and requested == ["/R-50.pkl"]
    assert not marker.exists() and R50 not in resolved
    # Hashed in a fresh folder only its owner can open, removed after loading.
    [(path, parent, mode)] = seen
    assert path != str(local) and mode == 0o700 and not os.path.exists(parent)
    found = hashlib.sha256((folder / "R-50.pkl").read_bytes()).hexdigest()
    [line] = [r.getMessage() for r in caplog.records if r.name == weights_pin.__name__]
    assert f"downloaded from {url} into a private folder" in line
    assert f"SHA-256 {found}" in line and f"PINNED_WEIGHTS[{R50!r}] = {found!r}" in line


def test_a_failed_download_names_the_url_and_leaves_no_folder(tmp_path, served, monkeypatch):
    from megdet.trainer.config import ConfigError

    folder, url, _ = served
    (folder / "R-50.pkl").unlink()
    made = []
    mkdtemp = weights_pin.tempfile.mkdtemp
    monkeypatch.setattr(
        weights_pin.tempfile, "mkdtemp", lambda **kw: made.append(mkdtemp(**kw)) or made[-1]
    )
    with pytest.raises(ConfigError) as err:
        _checkpointer(tmp_path).load_weights(R50, key="--weights", trusted=True)
    assert str(err.value) == (
        f"--weights: {R50!r} could not be downloaded from {url}: HTTP Error 404: File not found"
    )
    assert made and not os.path.exists(made[0])


def test_no_writable_temporary_folder_is_an_error_naming_it(tmp_path, served, monkeypatch):
    from megdet.trainer.config import ConfigError

    _, url, requested = served
    missing = tmp_path / "no-such-tmp"
    monkeypatch.setattr(weights_pin.tempfile, "tempdir", str(missing))
    with pytest.raises(ConfigError) as err:
        _checkpointer(tmp_path).load_weights(R50, trusted=True)
    assert str(err.value).startswith(
        f"MODEL.WEIGHTS: {R50!r} could not be downloaded from {url}: no private folder could "
        f"be made in {missing} (TMPDIR): "
    )
    assert requested == []


def test_a_download_is_not_redirected_to_another_scheme(tmp_path, served, monkeypatch):
    from megdet.trainer.config import ConfigError

    _, url, requested = served
    moved = url.replace("/R-50.pkl", "/moved")
    monkeypatch.setattr(weights_pin, "official_url", lambda name: moved)
    with pytest.raises(ConfigError) as err:
        _checkpointer(tmp_path).load_weights(R50, trusted=True)
    assert "redirected to https://127.0.0.1:" in str(err.value) and requested == ["/moved"]


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
    tmp_path, cached, shapes, capsys, monkeypatch, own_log_handlers
):
    local, marker, _ = cached
    expected = "ab" * 32
    monkeypatch.setitem(weights_pin.PINNED_WEIGHTS, R50, expected)
    argv = train_argv(tmp_path / "out", shapes, "megdet_tiny_cpu", "MODEL.WEIGHTS", R50)
    code, err = run_megdet(argv, capsys)
    found = hashlib.sha256(local.read_bytes()).hexdigest()
    assert code == 2 and "Traceback" not in err, err
    assert f"megdet train: error: MODEL.WEIGHTS: {R50!r} is refused: its local file {local}" in err
    assert f"SHA-256 {found}, expected {expected}" in err
    assert not marker.exists()


def test_megdet_train_exits_2_naming_the_url_it_could_not_download(
    tmp_path, served, shapes, capsys, own_log_handlers
):
    folder, url, requested = served
    (folder / "R-50.pkl").unlink()
    argv = train_argv(tmp_path / "out", shapes, "megdet_tiny_cpu", "MODEL.WEIGHTS", R50)
    code, err = run_megdet(argv, capsys)
    assert code == 2 and "Traceback" not in err, err
    assert (
        f"megdet train: error: MODEL.WEIGHTS: {R50!r} could not be downloaded from {url}: "
        "HTTP Error 404: File not found" in err
    )
    assert requested == ["/R-50.pkl"]
