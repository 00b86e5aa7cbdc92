"""`megdet plan` as users run it: a real subprocess, JSON that matches the module."""

import json
import subprocess
import sys

import pytest

from megdet.plan import plan_run


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "megdet", "plan", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("flags", "spec"),
    [
        (["--gpus", "16"], {"gpus": 16}),
        (["--gpus", "128"], {"gpus": 128}),
        (
            [
                "--gpus",
                "4",
                "--gpus-per-node",
                "4",
                "--accumulation-steps",
                "4",
                "--scaling",
                "sqrt",
            ],
            {"gpus": 4, "gpus_per_node": 4, "accumulation_steps": 4, "scaling": "sqrt"},
        ),
        (
            [
                "--gpus",
                "32",
                "--images-per-gpu",
                "4",
                "--base-lr",
                "0.01",
                "--reference-batch",
                "32",
                "--schedule",
                "three-stage",
            ],
            {
                "gpus": 32,
                "images_per_gpu": 4,
                "base_lr": 0.01,
                "reference_batch": 32,
                "schedule": "three-stage",
            },
        ),
        (
            ["--gpus", "8", "--max-iter", "1000", "--steps", "600", "900", "--warmup-iters", "50"],
            {"gpus": 8, "max_iter": 1000, "steps": [600, 900], "warmup_iters": 50},
        ),
    ],
)
def test_json_output_matches_the_plan_module(flags, spec):
    result = run_cli(*flags, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == plan_run(spec).summary()


def test_human_output_is_a_table_with_the_key_numbers():
    result = run_cli("--gpus", "16")
    assert result.returncode == 0
    lines = dict(line.split("  ", 1) for line in result.stdout.splitlines())
    assert lines["world size"].strip() == "16 (2 node(s) x 8)"
    assert lines["learning rate"].strip().startswith("0.04 ")
    assert lines["LR steps"].strip() == "30000, 40000"
    assert lines["warmup iterations"].strip() == "500"


def test_plot_writes_a_png(tmp_path):
    out = tmp_path / "lr.png"
    result = run_cli("--gpus", "16", "--schedule", "three-stage", "--plot", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpus", "12"], "gpus: 12 is not a multiple of gpus_per_node 8"),
        (["--gpus", "0"], "gpus: 0 is invalid"),
        (["--gpus", "x"], "argument --gpus: 'x' is not a whole number"),
        (["--gpus", "8", "--scaling", "cubic"], "argument --scaling: invalid choice: 'cubic'"),
        (["--gpus", "8", "--base-lr", "-1"], "base_lr: -1.0 is invalid"),
        (["--gpus", "8", "--bogus"], "unrecognized arguments: --bogus"),
        ([], "the following arguments are required: --gpus"),
        (["--gpus", "8", "--plot", "/nonexistent/dir/lr.png"], "--plot: cannot write"),
        (["--gpus", "8", "--from-gpus", "4"], "--from-gpus: needs --images-done"),
        (["--gpus", "8", "--resize", "rescale"], "--resize: needs --images-done"),
        (["--gpus", "8", "--images-done", "-5"], "images_done: -5 is invalid: must be >= 0"),
        (["--gpus", "8", "--images-done", "1e5"], "argument --images-done: '1e5' is not a whole"),
        (
            ["--gpus", "8", "--images-done", "5", "--resize", "grow"],
            "argument --resize: invalid choice: 'grow'",
        ),
    ],
)
def test_bad_flags_exit_2_with_a_message_and_no_traceback(flags, message):
    result = run_cli(*flags)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_a_continuation_prints_what_changed_and_why():
    result = run_cli("--gpus", "8", "--images-done", "480000", "--from-gpus", "16")
    assert result.returncode == 0, result.stderr
    assert "continues at        iteration 15000 after 480,000 images; 30000 iterations left" in (
        result.stdout
    )
    assert "On 8 GPUs (was 16, global batch 32, lr 0.04): global batch 32, lr 0.04" in result.stdout
    assert "global batch 32 kept: 8 GPUs x 2 images x 2 accumulation steps" in result.stdout


def test_a_continuation_as_json_is_the_plan_modules():
    from megdet.plan import plan_continuation

    result = run_cli("--gpus", "32", "--images-done", "480000", "--resize", "rescale", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out == plan_continuation({"gpus": 32}, 480000, run_batch=64, resize="rescale").summary()
    assert {k: out[k] for k in ("start_iter", "max_iter", "global_batch", "lr", "steps")} == {
        "start_iter": 7500, "max_iter": 22500, "global_batch": 64, "lr": 0.08,
        "steps": [15000, 20000],
    }  # fmt: skip
    assert (out["accumulation_steps"], out["images_seen"], out["resize"]) == (1, 1440000, "rescale")


def test_a_continuation_plots_the_run_so_far_and_the_rest(tmp_path):
    png = tmp_path / "lr.png"
    result = run_cli(
        "--gpus", "8", "--images-done", "700000", "--from-gpus", "16", "--plot", str(png)
    )
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
