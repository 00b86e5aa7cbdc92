"""Config loading, planning into the config, and bad CLI/config input (exit 2, key named)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

_CUDA = torch.cuda.is_available()


def _run_cli(argv, capsys):
    from megdet.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err


def _train_args(shapes, *extra):
    return [
        "train", "--config", "megdet_tiny_cpu",
        "--train-json", str(shapes["train_json"]), "--train-images", str(shapes["train_images"]),
        *extra,
    ]  # fmt: skip


def test_shipped_configs_load_by_name_and_inherit_the_base():
    from megdet.trainer.config import load_config

    prod = load_config("megdet_R50_FPN_1x.yaml")
    tiny = load_config("megdet_tiny_cpu")
    assert prod.MODEL.RESNETS.DEPTH == 50 and prod.SOLVER.BASE_LR == 0.02
    assert prod.SOLVER.MAX_ITER == 90000 and prod.MEGDET.REFERENCE_BATCH == 16
    assert tiny.MODEL.RESNETS.DEPTH == 18 and tiny.MEGDET.SYNC_BN == "backbone"
    # From the shared _BASE_:
    assert prod.MODEL.RESNETS.NORM == tiny.MODEL.RESNETS.NORM == "BN"


def test_plan_writes_the_planned_solver_values_for_the_actual_world_size():
    from megdet.plan import plan_run
    from megdet.trainer.config import load_config, plan_config, spec_from_config

    cfg = load_config("megdet_R50_FPN_1x.yaml", ["MEGDET.ACCUMULATION_STEPS", "2"])
    expected = plan_run(spec_from_config(cfg, 16, 8))
    plan = plan_config(cfg, 16, 8)
    assert plan == expected
    # 16 GPUs x 2 images x 2 micro-batches = 64 = 4x the reference batch of 16.
    assert cfg.SOLVER.IMS_PER_BATCH == 64
    assert pytest.approx(0.08) == cfg.SOLVER.BASE_LR
    assert cfg.SOLVER.MAX_ITER == 22500
    assert tuple(cfg.SOLVER.STEPS) == (15000, 20000)
    assert cfg.SOLVER.WARMUP_ITERS == 250
    assert cfg.SOLVER.CHECKPOINT_PERIOD == plan.scale_iters(5000) == 1250


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["MEGDET.SYNC_BN", "foo"], ["MEGDET.SYNC_BN", "backbone, all, none"]),
        (["MEGDET.SCHEDULE", "cosine"], ["MEGDET.SCHEDULE", "step, three-stage"]),
        (["MEGDET.NOPE", "1"], ["MEGDET.NOPE", "unknown config key", "SYNC_BN"]),
        (["SOLVER.BASE_LR", "fast"], ["SOLVER.BASE_LR", "'fast'"]),
        (["MEGDET.IMAGES_PER_GPU", "0"], ["MEGDET.IMAGES_PER_GPU", ">= 1"]),
        (["MEGDET.AMP", "True"], ["MEGDET.AMP", "CUDA"]),
        (
            ["MEGDET.BN_GROUP_SIZE", "3"],
            ["MEGDET.BN_GROUP_SIZE", "divide the world size 2", "0 (the whole world) or 1, 2"],
        ),
        (["MEGDET.RESIZE", "grow"], ["MEGDET.RESIZE", "keep-batch, rescale"]),
        (["SOLVER.STEPS", "(500,)"], ["SOLVER.STEPS", "max_iter"]),
        (["MEGDET.SYNC_BN"], ["KEY VALUE pairs"]),
    ],
)
def test_bad_config_input_exits_2_naming_the_key(shapes, capsys, overrides, named):
    code, err = _run_cli(_train_args(shapes, "--num-workers", "2", *overrides), capsys)
    assert code == 2
    assert err.startswith("megdet train: error: ")
    assert "Traceback" not in err
    for text in named:
        assert text in err


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        # detectron2's assert on a combination of MODEL keys
        (["MODEL.RESNETS.RES2_OUT_CHANNELS", "32"],
         ["Must set MODEL.RESNETS.RES2_OUT_CHANNELS = 64 for R18/R34"]),
        # a registry without the named component
        (["MODEL.BACKBONE.NAME", "build_nope_backbone"],
         ["No object named 'build_nope_backbone' found in 'BACKBONE' registry"]),
    ],
)  # fmt: skip
def test_a_model_detectron2_cannot_build_exits_2_with_its_words(tmp_path, shapes, overrides, named):
    # The command as a user runs it (in this process the trainer's log handlers would outlive
    # the test's captured stderr).
    argv = _train_args(shapes, "--output", str(tmp_path / "out"), *overrides)
    done = subprocess.run(
        [sys.executable, "-m", "megdet", *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stderr[-3000:]
    said = "megdet train: error: MODEL: detectron2 cannot build this model: "
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    for text in named:
        assert text in done.stderr


def test_a_builders_assert_without_words_is_named_by_its_line(monkeypatch, tmp_path) -> None:
    import importlib.util

    from megdet.trainer import engine
    from megdet.trainer.config import ConfigError

    # detectron2's kind of assert, bare, in a module of its own (pytest rewrites the asserts of
    # test modules, adding words).
    (tmp_path / "builders.py").write_text(
        "def build_model(cfg):\n    assert cfg.MODEL.RESNETS.DEPTH in (18, 34)\n"
    )
    spec = importlib.util.spec_from_file_location("builders", tmp_path / "builders.py")
    builders = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builders)
    monkeypatch.setattr(engine, "build_model", builders.build_model)
    cfg = engine.CfgNode({"MODEL": {"RESNETS": {"DEPTH": 7}}})
    with pytest.raises(ConfigError) as refused:
        engine.build_megdet_model(cfg)
    assert str(refused.value) == (
        "MODEL: detectron2 cannot build this model: AssertionError at "
        f"{tmp_path / 'builders.py'}:2: assert cfg.MODEL.RESNETS.DEPTH in (18, 34)"
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--config", "no_such_config"], ["--config", "megdet_tiny_cpu.yaml"]),
        (["--config", "megdet_tiny_cpu", "--train-json", "/nonexistent/train.json",
          "--train-images", "/tmp"], ["MEGDET.DATA.TRAIN_JSON", "/nonexistent/train.json"]),
        (["--config", "megdet_tiny_cpu"], ["MEGDET.DATA.TRAIN_JSON", "required"]),
        # The production config asks for CUDA; without a GPU that is the first problem.
        (["--config", "megdet_R50_FPN_1x"], ["MODEL.DEVICE", "cpu"] if not _CUDA
         else ["MEGDET.DATA.TRAIN_JSON", "/data/coco"]),
    ],
)  # fmt: skip
def test_bad_train_flags_exit_2_naming_the_flag(capsys, args, named):
    code, err = _run_cli(["train", *args], capsys)
    assert code == 2 and "Traceback" not in err
    for text in named:
        assert text in err


def test_num_workers_must_be_positive(capsys):
    code, err = _run_cli(["train", "--config", "megdet_tiny_cpu", "--num-workers", "0"], capsys)
    assert code == 2 and "--num-workers" in err


def test_malformed_training_json_exits_2_naming_the_file(tmp_path, shapes, capsys):
    from megdet.cli import main

    broken = tmp_path / "train.json"
    broken.write_text('{"images": [ ')
    code = main(
        [
            "train", "--config", "megdet_tiny_cpu", "--output", str(tmp_path / "out"),
            "--train-json", str(broken), "--train-images", str(shapes["train_images"]),
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert f"megdet train: error: annotation file: {broken} is not valid JSON" in err


def test_eval_requires_existing_weights(shapes, capsys):
    code, err = _run_cli(
        ["eval", "--config", "megdet_tiny_cpu", "--weights", "/nonexistent.pth",
         "--val-json", str(shapes["val_json"]), "--val-images", str(shapes["val_images"])],
        capsys,
    )  # fmt: skip
    assert code == 2 and "--weights" in err


def test_registering_the_cli_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, argparse\n"
        "from megdet.trainer import cli\n"
        "p = argparse.ArgumentParser(); cli.register(p.add_subparsers())\n"
        "assert 'torch' not in sys.modules and 'detectron2' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# What the operators put on a pod (node meaning): Kubeflow v1 PyTorchJob (kubeflow/trainer
# v1.9.4 pkg/controller.v1/pytorch/envvar.go) and Trainer v2 (v2.3.0 plugins/torch/torch.go).
PYTORCHJOB_POD_ENV = {
    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "PET_MASTER_ADDR": "127.0.0.1",
    "PET_MASTER_PORT": "1", "PET_NNODES": "2", "PET_NODE_RANK": "1",
    "PET_NPROC_PER_NODE": "1", "WORLD_SIZE": "2", "RANK": "1",
}  # fmt: skip
TRAINJOB_POD_ENV = {
    "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "1",
}  # fmt: skip


@pytest.mark.parametrize("pod_env", [PYTORCHJOB_POD_ENV, TRAINJOB_POD_ENV], ids=["v1", "v2"])
@pytest.mark.parametrize("command", ["train", "eval"])
def test_train_in_an_operator_pod_without_torchrun_is_refused(
    tmp_path, shapes, capsys, monkeypatch, pod_env, command
):
    # `megdet train` as the container command: RANK is the node rank, WORLD_SIZE the node
    # count (or absent under Trainer v2). It must neither join that "world" (MASTER_PORT 1:
    # a hang, then a wrong-size world) nor train alone; it says what to run instead.
    for key in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in pod_env.items():
        monkeypatch.setenv(key, value)
    weights = tmp_path / "w.pth"
    weights.write_bytes(b"")
    output = tmp_path / "out"
    if command == "train":
        argv = _train_args(shapes, "--output", str(output))
    else:
        argv = [
            "eval", "--config", "megdet_tiny_cpu", "--weights", str(weights), "--output",
            str(output), "--val-json", str(shapes["val_json"]),
            "--val-images", str(shapes["val_images"]),
        ]  # fmt: skip
    code, err = _run_cli(argv, capsys)
    assert code == 2, err[-2000:]
    assert "not started by torchrun (TORCHELASTIC_RUN_ID is unset)" in err
    assert "megdet launch train" in err
    assert f"PET_NNODES={pod_env['PET_NNODES']}" in err
    assert not output.exists()  # nothing trained


def test_only_torchruns_own_variable_makes_a_process_a_rank():
    from megdet.trainer.workers import bare_pod_problem, in_torchrun

    torchrun_worker = {
        **PYTORCHJOB_POD_ENV, "TORCHELASTIC_RUN_ID": "job", "RANK": "3", "WORLD_SIZE": "4",
        "LOCAL_RANK": "1", "GROUP_RANK": "1",
    }  # fmt: skip
    assert in_torchrun(torchrun_worker) and bare_pod_problem(torchrun_worker) is None
    assert not in_torchrun(PYTORCHJOB_POD_ENV) and bare_pod_problem(PYTORCHJOB_POD_ENV)
    assert not in_torchrun(TRAINJOB_POD_ENV) and bare_pod_problem(TRAINJOB_POD_ENV)
    assert not in_torchrun({}) and bare_pod_problem({}) is None  # a laptop: spawn locally
