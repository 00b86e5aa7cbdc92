"""Nothing in data runs code: checkpoints, MODEL.WEIGHTS and config YAML (docs/trainer.md Safety).

Each crafted file really runs code when loaded the unsafe way (the tests check that too, with a
harmless marker file), so a refusal that lets it through fails the test.
"""

from __future__ import annotations

import contextlib
import pickle
import re

import pytest
import torch
from torch import nn
from trainer_fakes import LinearDetector, RunsCode, checkpointer, run_megdet

# --- 1. resuming reads tensors only ---------------------------------------------------------


@pytest.mark.parametrize("zipfile", [True, False], ids=["zip", "legacy-format"])
@pytest.mark.parametrize("forced_off", [False, True], ids=["default", "TORCH_FORCE_NO_WO"])
def test_resume_refuses_a_checkpoint_whose_unpickling_would_run_code(
    tmp_path, monkeypatch, zipfile, forced_off
):
    from megdet.trainer.checkpoint import UnsafeCheckpointError

    if forced_off:
        # torch's escape hatch turns weights_only off where a caller leaves it unset; ours is
        # explicit, so it must not.
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    out = tmp_path / "out"
    model, holder, ckpt = checkpointer(out)
    holder.iteration = 9
    ckpt.save("model_0000009", iteration=9)
    marker = tmp_path / "marker"
    evil = out / "model_0000019.pth"  # the newest: the one resume picks
    torch.save(
        {"model": model.state_dict(), "trainer": {"iteration": 19}, "iteration": 19,
         "extra": RunsCode(marker)},
        evil, _use_new_zipfile_serialization=zipfile,
    )  # fmt: skip
    (out / "last_checkpoint").write_text(evil.name)  # named as the last saved

    fresh_model, fresh_holder, fresh = checkpointer(out)
    before = fresh_model.weight.detach().clone()
    with pytest.raises(UnsafeCheckpointError) as err:
        fresh.resume_latest()
    message = str(err.value)
    # The global is named (torch spells builtins "exec" in the legacy format).
    named = rf"{re.escape(str(evil))}: contains non-tensor objects \((builtins\.)?exec\)"
    assert re.match(named, message), message
    assert "could run code" in message
    assert not marker.exists()
    # Refused, not skipped for the older checkpoint: nothing was loaded.
    assert fresh_holder.iteration == -1
    assert torch.equal(fresh_model.weight, before)

    # The file is live: full unpickling (what resuming did before) runs its code.
    torch.load(evil, weights_only=False)
    assert marker.read_text() == "ran"


def _quadratic() -> LinearDetector:
    return LinearDetector(lambda out: {"loss": ((out - 1.0) ** 2).mean()})


def _train_quadratic(out, start: int, stop_after: int | None = None, max_iter: int = 6):
    """A real MegDetTrainer (momentum SGD, the planned LR hook); ``stop_after`` an iteration,
    it saves a checkpoint and stops the way StopOnSignal does on SIGTERM."""
    from detectron2.engine import hooks

    from megdet.plan import plan_run
    from megdet.trainer.checkpoint import AtomicCheckpointer
    from megdet.trainer.engine import MegDetTrainer, TrainingInterrupted
    from megdet.trainer.solver import PlanParamScheduler

    class StopAfter(hooks.HookBase):
        def after_step(self) -> None:
            if self.trainer.iter == stop_after:
                checkpointer.save(f"model_{stop_after:07d}", iteration=stop_after)
                raise TrainingInterrupted(stop_after)

    plan = plan_run(
        {"gpus": 1, "images_per_gpu": 2, "reference_batch": 2, "base_lr": 0.05,
         "max_iter": max_iter, "steps": (4,), "warmup_iters": 2}
    )  # fmt: skip
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randn(2, 3, generator=generator) for _ in range(max_iter)]
    out.mkdir(parents=True, exist_ok=True)
    model = _quadratic()
    optimizer = torch.optim.SGD(model.parameters(), lr=plan.lr, momentum=0.9)
    trainer = MegDetTrainer(model, iter(batches[start:]), optimizer)
    checkpointer = AtomicCheckpointer(model, str(out), trainer=trainer)
    trainer.register_hooks([hooks.LRScheduler(optimizer, PlanParamScheduler(plan)), StopAfter()])
    if start:
        assert checkpointer.resume_latest()["iteration"] == start - 1
    with contextlib.suppress(TrainingInterrupted):
        trainer.train(start, max_iter)
    return model


def test_the_trainers_own_checkpoints_resume_exactly_weights_only(tmp_path):
    # What a real checkpoint holds (model, momentum buffers, param groups, the LR hook's
    # base_lrs/last_epoch, iteration) loads weights-only, with no allow-listed class, and a
    # stopped-and-resumed run ends exactly where an uninterrupted one does.
    straight = _train_quadratic(tmp_path / "straight", 0)
    _train_quadratic(tmp_path / "resumed", 0, stop_after=2)
    saved = tmp_path / "resumed" / "model_0000002.pth"
    assert torch.serialization.get_unsafe_globals_in_checkpoint(saved) == []
    state = torch.load(saved, weights_only=True)
    assert state["iteration"] == 2 and state["trainer"]["hooks"]["LRScheduler"]["last_epoch"] == 3
    assert state["trainer"]["optimizer"]["state"]  # momentum buffers
    resumed = _train_quadratic(tmp_path / "resumed", 3)
    assert not torch.equal(resumed.body.weight, _quadratic().body.weight)  # it trained
    torch.testing.assert_close(resumed.body.weight, straight.body.weight, rtol=0, atol=0)
    torch.testing.assert_close(resumed.body.bias, straight.body.bias, rtol=0, atol=0)


# --- 2. MODEL.WEIGHTS / --weights ------------------------------------------------------------


def test_weights_file_with_non_tensor_objects_is_refused_unless_trusted(tmp_path):
    from megdet.trainer.checkpoint import UnsafeCheckpointError

    marker = tmp_path / "marker"
    weights = tmp_path / "pretrained.pth"
    torch.save({"model": nn.Linear(3, 2).state_dict(), "meta": RunsCode(marker)}, weights)
    _, _, ckpt = checkpointer(tmp_path / "out")
    with pytest.raises(UnsafeCheckpointError) as err:
        ckpt.load_weights(str(weights))
    message = str(err.value)
    assert f"{weights}: contains non-tensor objects (builtins.exec)" in message
    assert "MODEL.WEIGHTS must hold only tensors" in message
    assert "MEGDET.ALLOW_UNSAFE_WEIGHTS True" in message
    assert not marker.exists()
    # The operator's switch hands the file to detectron2's own (full) unpickling.
    ckpt.load_weights(str(weights), trusted=True)
    assert marker.exists()


def test_a_state_dict_of_tensors_loads_as_weights(tmp_path):
    source = nn.Linear(3, 2)
    weights = tmp_path / "pretrained.pth"
    torch.save({"model": source.state_dict()}, weights)
    model, holder, ckpt = checkpointer(tmp_path / "out")
    ckpt.load_weights(str(weights))
    assert torch.equal(model.weight, source.weight) and holder.iteration == -1


@pytest.mark.parametrize("name", ["w.pkl", "w.pickle", "w.pyth", "W.PKL"])
def test_pickle_weights_are_refused_before_unpickling(tmp_path, name):
    # Even past config validation (a caller of build_trainer): the checkpointer itself refuses.
    from megdet.trainer.checkpoint import UnsafeCheckpointError

    marker = tmp_path / "marker"
    weights = tmp_path / name
    weights.write_bytes(pickle.dumps({"model": {}, "__author__": "x", "m": RunsCode(marker)}))
    _, _, ckpt = checkpointer(tmp_path / "out")
    with pytest.raises(UnsafeCheckpointError) as err:
        ckpt.load_weights(str(weights), key="--weights")
    assert str(err.value).startswith(f"--weights: {str(weights)!r} is refused: a pickle file")
    assert not marker.exists()
    pickle.loads(weights.read_bytes())  # live payload
    assert marker.exists()


def test_url_weights_are_refused_without_downloading(tmp_path):
    from megdet.trainer.checkpoint import UnsafeCheckpointError

    class NoNetwork:
        def get_local_path(self, path, **kwargs):
            raise AssertionError(f"downloaded {path}")

    _, _, ckpt = checkpointer(tmp_path)
    ckpt.path_manager = NoNetwork()
    for url in ("https://example.com/model.pth", "detectron2://COCO/model_final.pkl"):
        with pytest.raises(UnsafeCheckpointError, match=r"MODEL\.WEIGHTS: .* is refused: a URL"):
            ckpt.load_weights(url)


REFUSED_WEIGHTS = [
    "https://example.com/model.pth",
    "http://example.com/model.pkl",
    "s3://bucket/model.pth",
    "detectron2://COCO-Detection/faster_rcnn_R_50_FPN_1x/137257794/model_final_b275ba.pkl",
    "catalog://ImageNetPretrained/MSRA/R-50",
    "/data/pretrained/R-50.pkl",
    "weights.pickle",
    "/data/W.PKL",
    "/data/model.pyth",
    # detectron2 strips the query before it picks the loader by the file's ending.
    "/data/w.pkl?matching_heuristics=True",
]


@pytest.mark.parametrize("weights", REFUSED_WEIGHTS)
def test_unsafe_model_weights_are_refused_at_config_time_unless_allowed(weights):
    from megdet.trainer.config import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config("megdet_tiny_cpu", ["MODEL.WEIGHTS", weights])
    message = str(err.value)
    assert message.startswith(f"MODEL.WEIGHTS: {weights!r} is refused: "), message
    assert "allowed: empty (no pretrained weights), a local PyTorch file (.pth, .pt)" in message
    assert "set MEGDET.ALLOW_UNSAFE_WEIGHTS True" in message
    allowed = ["MODEL.WEIGHTS", weights, "MEGDET.ALLOW_UNSAFE_WEIGHTS", "True"]
    cfg = load_config("megdet_tiny_cpu", allowed)
    assert weights == cfg.MODEL.WEIGHTS


@pytest.mark.parametrize(
    "weights", ["", "/data/pretrained/r50.pth", "model.pt", "detectron2://ImageNetPretrained/MSRA/R-50.pkl"]
)  # fmt: skip
def test_safe_and_shipped_model_weights_are_accepted(weights):
    from megdet.trainer.config import load_config

    cfg = load_config("megdet_tiny_cpu", ["MODEL.WEIGHTS", weights])
    assert weights == cfg.MODEL.WEIGHTS


def test_unsafe_weights_exit_2_from_flags_and_from_a_config_file(tmp_path, shapes, capsys):
    from megdet.trainer.config import CONFIG_DIR

    base = ["train", "--output", str(tmp_path / "out"),
            "--train-json", str(shapes["train_json"]),
            "--train-images", str(shapes["train_images"])]  # fmt: skip
    code, err = run_megdet([*base, "--config", "megdet_tiny_cpu", "MODEL.WEIGHTS", "https://x/y.pkl"],
                         capsys)  # fmt: skip
    assert code == 2 and "Traceback" not in err
    assert err.startswith("megdet train: error: MODEL.WEIGHTS: 'https://x/y.pkl' is refused")

    config = tmp_path / "spec-config.yaml"  # a MegDetRun's spec.config
    config.write_text(
        f"_BASE_: {CONFIG_DIR / 'megdet_tiny_cpu.yaml'}\nMODEL:\n  WEIGHTS: s3://b/w.pth\n"
    )
    code, err = run_megdet([*base, "--config", str(config)], capsys)
    assert code == 2 and "Traceback" not in err
    assert "MODEL.WEIGHTS: 's3://b/w.pth' is refused: a URL" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["yes", "1"])
def test_allow_unsafe_weights_must_be_a_boolean(value):
    from megdet.trainer.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^MEGDET\.ALLOW_UNSAFE_WEIGHTS: "):
        load_config("megdet_tiny_cpu", ["MEGDET.ALLOW_UNSAFE_WEIGHTS", value])


def test_eval_refuses_pickle_weights(tmp_path, shapes, capsys):
    marker = tmp_path / "marker"
    weights = tmp_path / "model.pkl"
    weights.write_bytes(pickle.dumps({"model": {}, "m": RunsCode(marker)}))
    code, err = run_megdet(
        ["eval", "--config", "megdet_tiny_cpu", "--weights", str(weights),
         "--output", str(tmp_path / "eval"),
         "--val-json", str(shapes["val_json"]), "--val-images", str(shapes["val_images"])],
        capsys,
    )  # fmt: skip
    assert code == 2 and "Traceback" not in err
    assert err.startswith(f"megdet eval: error: --weights: {str(weights)!r} is refused")
    assert "MEGDET.ALLOW_UNSAFE_WEIGHTS" in err
    assert not marker.exists()


# --- 3. config YAML is safe-loaded -----------------------------------------------------------

PYTHON_TAGS = [
    '!!python/object/apply:os.system ["touch {marker}"]',
    '!!python/object/new:os.system ["touch {marker}"]',
    '!!python/object/apply:subprocess.check_call [["touch", "{marker}"]]',
]


@pytest.mark.parametrize("tag", PYTHON_TAGS, ids=["apply", "new", "subprocess"])
@pytest.mark.parametrize("where", ["config", "base"])
def test_a_config_with_a_python_tag_is_refused_and_never_runs(tmp_path, shapes, capsys, tag, where):
    import yaml

    from megdet.trainer.config import CONFIG_DIR, ConfigError, load_config

    marker = tmp_path / "marker"
    payload = f"SEED: {tag.format(marker=marker)}\n"
    config = tmp_path / "config.yaml"
    shipped = f"_BASE_: {CONFIG_DIR / 'megdet_tiny_cpu.yaml'}\n"
    if where == "config":
        config.write_text(shipped + payload)
        tagged = config
    else:  # the tag hides in a _BASE_ file
        tagged = tmp_path / "base.yaml"
        tagged.write_text(shipped + payload)
        config.write_text("_BASE_: base.yaml\nSOLVER:\n  MAX_ITER: 10\n")
    with pytest.raises(ConfigError, match="is refused: a YAML tag"):
        load_config(str(config))
    assert not marker.exists()
    code, err = run_megdet(
        ["train", "--config", str(config), "--output", str(tmp_path / "out"),
         "--train-json", str(shapes["train_json"]), "--train-images", str(shapes["train_images"])],
        capsys,
    )  # fmt: skip
    assert code == 2 and "Traceback" not in err
    assert err.startswith(f"megdet train: error: --config: {config} is refused: a YAML tag"), err
    assert f"({tagged}, line 2, column 7)" in err
    assert "python/object" in err
    assert not marker.exists()
    assert not (tmp_path / "out").exists()

    # The payload is live: unsafe loading (detectron2's fallback) would have run it.
    yaml.unsafe_load(payload)
    assert marker.exists()


def test_malformed_yaml_is_a_clear_error_naming_the_file(tmp_path):
    from megdet.trainer.config import ConfigError, load_config

    config = tmp_path / "config.yaml"
    config.write_text("SOLVER:\n  STEPS: [1, 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(config))
    assert str(err.value).startswith(f"--config: {config} is not valid YAML: ")
    assert "line 3" in str(err.value)
