"""No file the trainer unpickles or fetches is chosen by a run's author without the grant:
MODEL.LOAD_PROPOSALS with DATASETS.PROPOSAL_FILES_* (detectron2
pickle.loads them, and downloads URLs), a config file that grants MEGDET.ALLOW_UNSAFE_WEIGHTS
itself, and a _BASE_ that is a URL (fvcore downloads it). The grant is the command line's
MEGDET.ALLOW_UNSAFE_WEIGHTS True, which the run chart passes only when the operator's
policy.unsafeWeights allows it (a config file is spec.config: the author's).

Each refusal goes through the real `megdet train` command line: exit 2, one line naming the
key, no traceback, nothing run or fetched.
"""

from __future__ import annotations

import http.server
import pickle
import threading

import pytest
from trainer_fakes import RunsCode, run_megdet, train_argv

from megdet.trainer.config import CONFIG_DIR

TINY = CONFIG_DIR / "megdet_tiny_cpu.yaml"


def _train(tmp_path, shapes, capsys, config, *overrides: str) -> tuple[int, str]:
    return run_megdet(train_argv(tmp_path / "out", shapes, config, *overrides), capsys)


@pytest.fixture()
def proposals(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "proposals.pkl"
    path.write_bytes(pickle.dumps({"ids": [], "boxes": [], "x": RunsCode(marker)}))
    # The file is live: unpickling it runs code.
    pickle.loads(path.read_bytes())
    assert marker.exists()
    marker.unlink()
    return path, marker


@pytest.mark.parametrize("where", ["overrides", "config"])
def test_loading_proposals_is_refused_without_the_grant(
    tmp_path, shapes, capsys, proposals, where
) -> None:
    path, marker = proposals
    keys = ["MODEL.LOAD_PROPOSALS", "True", "DATASETS.PROPOSAL_FILES_TRAIN", f"('{path}',)"]
    if where == "overrides":  # a MegDetRun's extraOverrides (MODEL.* and DATASETS.* are free)
        code, err = _train(tmp_path, shapes, capsys, "megdet_tiny_cpu", *keys)
    else:  # a MegDetRun's spec.config
        config = tmp_path / "spec-config.yaml"
        config.write_text(
            f"_BASE_: {TINY}\nMODEL:\n  LOAD_PROPOSALS: True\n"
            f"DATASETS:\n  PROPOSAL_FILES_TRAIN: ['{path}']\n"
        )
        code, err = _train(tmp_path, shapes, capsys, config)
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith("megdet train: error: MODEL.LOAD_PROPOSALS: True is refused"), err
    assert "DATASETS.PROPOSAL_FILES_TRAIN" in err and str(path) in err
    assert "MEGDET.ALLOW_UNSAFE_WEIGHTS True (on the command line" in err
    assert len(err.strip().splitlines()) == 1
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_the_command_line_grant_lets_proposals_load() -> None:
    from megdet.trainer.config import load_config

    cfg = load_config(
        "megdet_tiny_cpu",
        ["MODEL.LOAD_PROPOSALS", "True", "MEGDET.ALLOW_UNSAFE_WEIGHTS", "True"],
    )
    assert cfg.MODEL.LOAD_PROPOSALS is True


@pytest.mark.parametrize("in_base", [False, True], ids=["config", "base"])
def test_a_config_file_cannot_grant_unsafe_files_itself(tmp_path, shapes, capsys, in_base) -> None:
    weights = tmp_path / "init.pkl"
    weights.write_bytes(pickle.dumps({"model": {}}))
    granting = tmp_path / ("base.yaml" if in_base else "spec-config.yaml")
    granting.write_text(
        f"_BASE_: {TINY}\nMEGDET:\n  ALLOW_UNSAFE_WEIGHTS: True\nMODEL:\n  WEIGHTS: {weights}\n"
    )
    config = granting
    if in_base:
        config = tmp_path / "spec-config.yaml"
        config.write_text("_BASE_: base.yaml\nSOLVER:\n  MAX_ITER: 10\n")
    code, err = _train(tmp_path, shapes, capsys, config)
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith(
        f"megdet train: error: MEGDET.ALLOW_UNSAFE_WEIGHTS: set to True in {granting}; "
        "a config file cannot grant it"
    ), err
    assert not (tmp_path / "out").exists()
    # The same file with the grant on the command line (the operator's): accepted.
    from megdet.trainer.config import load_config

    cfg = load_config(str(config), ["MEGDET.ALLOW_UNSAFE_WEIGHTS", "True"])
    assert str(weights) == cfg.MODEL.WEIGHTS
    # A file that sets it False grants nothing and is fine.
    plain = tmp_path / "plain.yaml"
    plain.write_text(f"_BASE_: {TINY}\nMEGDET:\n  ALLOW_UNSAFE_WEIGHTS: False\n")
    assert load_config(str(plain)).MEGDET.ALLOW_UNSAFE_WEIGHTS is False


@pytest.fixture()
def served(tmp_path, monkeypatch):
    """A local HTTP server with one YAML config; yields (url, the paths requested)."""
    monkeypatch.setenv("FVCORE_CACHE", str(tmp_path / "cache"))  # iopath's download cache
    body = b"SOLVER:\n  MAX_ITER: 7\n"
    requested: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            requested.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/base.yaml", requested
    finally:
        server.shutdown()
        server.server_close()


def test_a_url_base_is_refused_without_fetching_it(tmp_path, shapes, capsys, served) -> None:
    url, requested = served
    config = tmp_path / "spec-config.yaml"
    config.write_text(f"_BASE_: {url}\nSOLVER:\n  BASE_LR: 0.01\n")
    code, err = _train(tmp_path, shapes, capsys, config)
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith(f"megdet train: error: _BASE_: '{url}' in {config} is refused: a URL")
    assert requested == []
    # A list of bases, and a detectron2:// base from a config in the working folder (fvcore
    # leaves it a URL): refused alike.
    config.write_text(f"_BASE_: ['{TINY}', '{url}']\n")
    code, err = _train(tmp_path, shapes, capsys, config)
    assert code == 2 and f"_BASE_: '{url}'" in err and requested == []
    from megdet.trainer.config import ConfigError, load_config

    monkeypatch = pytest.MonkeyPatch()
    try:
        monkeypatch.chdir(tmp_path)
        (tmp_path / "here.yaml").write_text("_BASE_: detectron2://Base-RCNN-FPN.yaml\n")
        with pytest.raises(ConfigError, match=r"^_BASE_: 'detectron2://Base-RCNN-FPN.yaml' in "):
            load_config("here.yaml")
    finally:
        monkeypatch.undo()
    # With the operator's grant the base is fetched (the seam is real, not a blanket refusal).
    config.write_text(f"_BASE_: ['{TINY}', '{url}']\n")
    cfg = load_config(str(config), ["MEGDET.ALLOW_UNSAFE_WEIGHTS", "True"])
    assert requested == ["/base.yaml"] and cfg.SOLVER.MAX_ITER == 7


def test_a_base_that_includes_itself_is_a_clear_error(tmp_path) -> None:
    from megdet.trainer.config import ConfigError, load_config

    config = tmp_path / "loop.yaml"
    config.write_text("_BASE_: ./loop.yaml\n")
    with pytest.raises(ConfigError, match=r"^_BASE_: .*loop.yaml' includes itself"):
        load_config(str(config))
