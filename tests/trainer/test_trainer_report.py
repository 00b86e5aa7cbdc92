"""`megdet report` and the report a finished run leaves (trainer/report*.py), on output folders
written here the way the trainer writes them: plan.json, metrics.json, detectron2's
JSONWriter lines in events.jsonl and rank 0's log.txt in detectron2's log format."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from megdet.cli import main
from megdet.trainer.report import build_report, report_json
from megdet.trainer.report_render import format_report, render_page

PLAN = {
    "world_size": 2, "nodes": 1, "gpus_per_node": 2, "procs_per_node": 2, "images_per_gpu": 4,
    "accumulation_steps": 1, "global_batch": 8, "scale": 1.0, "scaling": "linear",
    "schedule": "step", "lr": 0.01, "max_iter": 40, "steps": [30], "warmup_iters": 5,
    "images_seen": 320, "reference_images_seen": 320,
}  # fmt: skip
METRICS = {
    "iteration": 40, "dataset": "val.json", "world_size": 2,
    "bbox": {"AP": 12.5, "AP50": 30.25, "AP75": 10.0, "APs": 5.0, "APm": 14.0, "APl": None},
}  # fmt: skip


def _event(iteration: int, loss: float | None = None, lr: float | None = None, **more) -> str:
    """One line as detectron2's JSONWriter writes it (sorted keys, NaN as NaN)."""
    event = dict(more, iteration=iteration)
    if loss is not None:
        event.update(total_loss=loss, lr=lr, time=0.5, data_time=0.01, loss_cls=loss / 2)
    return json.dumps(event, sort_keys=True)


def _attempt_log(start: str, start_iter: int, world: int = 2, batch: int = 8, **parts) -> str:
    """One attempt in rank 0's log.txt: the claim, the plan, the loop and its timing lines."""
    day, clock = start.split(" ")
    h, m, s = (int(x) for x in clock.split(":"))

    def at(seconds: int) -> str:
        total = h * 3600 + m * 60 + s + seconds
        return f"[{day} {total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}]"

    lines = [
        f"{at(0)} megdet.trainer INFO: Continuing in /out: a local run's folder",
        f"{at(0)} megdet.trainer INFO: Plan for the world this run found:",
        f"  world_size: {world}",
        f"  global_batch: {batch}",
        f"{at(1)} megdet.trainer.fabric INFO: Fabric: ranks 0-{world - 1} on gloo (not NCCL)",
        f"{at(2)} d2.engine.train_loop INFO: Starting training from iteration {start_iter}",
        f"{at(5)} d2.evaluation.evaluator INFO: Total inference time: 0:00:01.500000 (0.1 s / "
        "iter per device, on 2 devices)",
    ]
    if parts.get("sigterm"):
        lines.append(f"{at(9)} megdet.trainer.engine WARNING: Saved a checkpoint at iteration "
                     f"{parts['sigterm']} after SIGTERM; exiting")  # fmt: skip
    lines += [
        f"{at(10)} d2.engine.hooks INFO: Overall training speed: 10 iterations in 0:00:06 "
        "(0.6000 s / it)",
        f"{at(10)} d2.engine.hooks INFO: Total training time: 0:00:07 (0:00:01 on hooks)",
    ]
    if not parts.get("sigterm"):
        lines.append(f"{at(12)} d2.evaluation.evaluator INFO: Total inference time: "
                     "0:00:00.500000 (0.1 s / iter per device, on 2 devices)")  # fmt: skip
    return "\n".join(lines) + "\n"


def write_run(
    folder: Path,
    plan: dict | None = None,
    events: list[str] | None = None,
    log: str | None = None,
    metrics: dict | None = METRICS,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(json.dumps(plan or PLAN, indent=2))
    if metrics is not None:
        (folder / "metrics.json").write_text(json.dumps(metrics, indent=2))
    default = [
        _event(19, 1.5, 0.01, **{"bbox/AP": 3.0, "bbox/AP50": 9.0, "bbox/APl": float("nan")}),
        _event(39, 0.75, 0.001),
        _event(40, **{"bbox/AP": 12.5, "bbox/AP50": 30.25}),
    ]
    (folder / "events.jsonl").write_text("\n".join(events or default) + "\n")
    (folder / "log.txt").write_text(log if log is not None else _attempt_log("12/06 05:00:00", 0))
    return folder


def test_a_finished_run_reports_ap_images_wall_time_attempts_and_fabric(tmp_path):
    report = build_report(write_run(tmp_path / "run"))
    assert report["finished"] is True
    assert report["ap"]["AP"] == 12.5 and report["ap"]["AP50"] == 30.25
    assert report["ap"]["APl"] is None and report["evaluated_at"] == 40
    assert report["iterations"] == {"done": 40, "planned": 40}
    assert report["images"] == {"seen": 320, "planned": 320}
    wall = report["wall_time"]
    assert wall["source"].startswith("log.txt")
    # 12 s from the first line to the last: 2 s setup, 6 s of timed steps, 1 s hooks, 2 s after
    # the loop; the loop's 8 s less detectron2's 7 s are its untimed first iterations.
    assert wall["total_s"] == 12 and wall["setup_s"] == 2
    assert wall["steps_s"] == pytest.approx(6.0) and wall["hooks_s"] == 1
    assert wall["untimed_s"] == 1 and wall["after_loop_s"] == 2 and wall["evaluation_s"] == 2.0
    # 10 timed iterations of 8 images in 6 s; 320 images in 12 s of wall time.
    assert report["images_per_second"]["steps"] == pytest.approx(80 / 6)
    assert report["images_per_second"]["end_to_end"] == pytest.approx(320 / 12)
    assert report["attempt_count"] == 1 and report["resumes"] == 0
    assert report["attempts"][0]["ended"] == "finished"
    assert report["fabric"] == "Fabric: ranks 0-1 on gloo (not NCCL)"
    assert report["segments"] == [
        {"world_size": 2, "global_batch": 8, "accumulation_steps": 1, "lr": 0.01,
         "resize": None, "first_iter": 0, "last_iter": 39, "images_start": 0, "images_end": 320}
    ]  # fmt: skip
    assert report["plan"] == PLAN
    # Curves at the images seen: iteration 19 ends after 20 x 8 images.
    assert report["curves"]["loss"] == [[160, 19, 1.5], [320, 39, 0.75]]
    assert report["curves"]["lr"] == [[160, 19, 0.01], [320, 39, 0.001]]
    assert report["curves"]["ap"] == [[160, 19, 3.0], [320, 40, 12.5]]
    assert report["curves"]["ap50"] == [[160, 19, 9.0], [320, 40, 30.25]]
    assert report["warnings"] == []
    json.loads(report_json(report))  # strict JSON: no NaN


def test_the_terminal_text_names_every_part(tmp_path, capsys):
    folder = write_run(tmp_path / "run")
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    for text in (
        "(finished)", "AP 12.5  AP50 30.2", "iterations     40 of 40",
        "images seen    320 of 320 planned", "wall time      12s", "setup", "steps",
        "images/s       13.3 in training steps, 26.7 end to end", "attempts       1 (0 resumed)",
        "fabric         Fabric: ranks 0-1 on gloo (not NCCL)", "0-39  x2  batch 8",
        "max_iter 40",
    ):  # fmt: skip
        assert text in out, (text, out)
    assert not (folder / "report.json").exists()  # read-only without --write


def test_write_leaves_report_json_and_a_self_contained_page_with_the_curves(tmp_path, capsys):
    folder = write_run(tmp_path / "run")
    assert main(["report", str(folder), "--write"]) == 0
    assert "Wrote " in capsys.readouterr().out
    saved = json.loads((folder / "report.json").read_text())
    assert saved["curves"]["loss"] == [[160, 19, 1.5], [320, 39, 0.75]]
    page = (folder / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"(src|href)=|https?://|<script(?! type=\"application/json\")", page)
    embedded = re.search(r'<script type="application/json" id="megdet-report">(.*?)</script>',
                         page, re.S).group(1)  # fmt: skip
    assert json.loads(embedded) == saved
    lines = dict(re.findall(r'<polyline data-name="([^"]+)" points="([^"]+)"', page))
    assert set(lines) == {"total loss", "lr", "AP", "AP50"}
    assert all(len(points.split()) == 2 for points in lines.values())
    assert "total loss 1.5 at iteration 19, 160 images" in page


def test_json_prints_what_report_json_holds(tmp_path, capsys):
    folder = write_run(tmp_path / "run")
    assert main(["report", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == build_report(folder)


def test_a_resumed_run_counts_attempts_and_replays_replace_lost_points(tmp_path):
    log = _attempt_log("12/06 05:00:00", 0, sigterm=25) + _attempt_log("12/06 05:10:00", 26)
    events = [
        _event(19, 2.0, 0.01),
        _event(25, 1.9, 0.01),  # written at the SIGTERM stop
        # A line the killed attempt's writer left cut short; a resume appends after it.
        '{"data_time": 0.01, "iteration": 3',
        _event(39, 0.5, 0.001),
    ]
    report = build_report(write_run(tmp_path / "run", events=events, log=log))
    assert report["attempt_count"] == 2 and report["resumes"] == 1
    assert [a["ended"] for a in report["attempts"]] == ["SIGTERM", "finished"]
    assert [a["start_iter"] for a in report["attempts"]] == [0, 26]
    assert report["wall_time"]["total_s"] == 10 + 12  # the 9m50s between attempts left out
    assert report["wall_time"]["steps_s"] == pytest.approx(12.0)
    assert report["curves"]["loss"] == [[160, 19, 2.0], [208, 25, 1.9], [320, 39, 0.5]]
    assert report["warnings"] == [
        "events.jsonl line 3: cut short (an attempt killed while writing); skipped"
    ]


def test_a_replay_after_a_kill_drops_the_points_the_killed_attempt_lost(tmp_path):
    log = _attempt_log("12/06 05:00:00", 0) + _attempt_log("12/06 05:10:00", 10)
    events = [_event(9, 3.0, 0.01), _event(19, 9.9, 0.01), _event(19, 2.0, 0.01),
              _event(29, 1.0, 0.01), _event(39, 0.5, 0.001)]  # fmt: skip
    report = build_report(write_run(tmp_path / "run", events=events, log=log))
    assert [p[1:] for p in report["curves"]["loss"]] == [[9, 3.0], [19, 2.0], [29, 1.0], [39, 0.5]]
    assert report["attempts"][0]["ended"].startswith("no end recorded")


# plan.json as trainer/elastic.py writes it after a resize: the plan summary of the segment
# in progress, and every segment (the earlier ones up to the checkpoint they resumed from).
SEGMENTED = dict(
    PLAN,
    world_size=4, global_batch=16, max_iter=75, start_iter=25, images_done=400,
    images_seen=1200, lr=0.02, resize="rescale", resize_reason="rescaled, as asked",
    segments=[
        {"world_size": 2, "global_batch": 8, "accumulation_steps": 1, "lr": 0.01,
         "resize": None, "first_iter": 0, "last_iter": 49, "images_start": 0, "images_end": 400},
        {"world_size": 4, "global_batch": 16, "accumulation_steps": 1, "lr": 0.02,
         "resize": "rescale", "first_iter": 25, "last_iter": 74, "images_start": 400,
         "images_end": 1200},
    ],
)  # fmt: skip


def test_segments_place_each_point_at_its_images_through_its_own_global_batch(tmp_path, capsys):
    # Two GPUs at batch 8 for 50 iterations (400 images), then four at batch 16: the iteration
    # numbers restart at 25 (400 / 16) and overlap the first segment's.
    log = _attempt_log("12/06 05:00:00", 0) + _attempt_log("12/06 05:10:00", 25, 4, 16)
    events = [_event(19, 2.0, 0.01), _event(39, 1.5, 0.01), _event(49, 1.2, 0.01),
              _event(39, 1.0, 0.02), _event(59, 0.8, 0.02), _event(74, 0.6, 0.002)]  # fmt: skip
    metrics = dict(METRICS, iteration=75)
    folder = write_run(tmp_path / "run", SEGMENTED, events, log, metrics)
    report = build_report(folder)
    assert report["curves"]["loss"] == [
        [160, 19, 2.0], [320, 39, 1.5], [400, 49, 1.2],
        [640, 39, 1.0], [960, 59, 0.8], [1200, 74, 0.6],
    ]  # fmt: skip
    assert report["images"] == {"seen": 1200, "planned": 1200}
    assert report["finished"] and report["iterations"] == {"done": 75, "planned": 75}
    assert [s["world_size"] for s in report["segments"]] == [2, 4]
    assert "segments" not in report["plan"] and report["plan"]["max_iter"] == 75
    # Each attempt's own global batch (from its plan in the log): 10 x 8 and 10 x 16 in 12 s.
    assert report["images_per_second"]["steps"] == pytest.approx((80 + 160) / 12)
    assert [a["world_size"] for a in report["attempts"]] == [2, 4]
    assert main(["report", str(folder), "--write"]) == 0
    out = capsys.readouterr().out
    assert "0-49  x2  batch 8" in out
    assert "25-74  x4  batch 16  accum 1  lr 0.02  images 400-1,200  rescale" in out
    page = (folder / "report.html").read_text()
    assert "4 GPUs</text>" in page  # the second segment's boundary


def test_a_continuation_plan_without_segments_is_one_segment_from_its_own_keys(tmp_path):
    plan = dict(PLAN, start_iter=20, images_done=160, resize="keep-batch", resize_reason="kept")
    report = build_report(write_run(tmp_path / "run", plan, log=""))
    seg = report["segments"][0]
    assert (seg["first_iter"], seg["images_start"], seg["resize"]) == (20, 160, "keep-batch")
    assert report["curves"]["loss"][0] == [160, 19, 1.5]  # iteration 19 ends the 20th
    # No log: wall time is the events' per-iteration times (20 and 20 iterations x 0.5 s).
    assert report["wall_time"]["steps_s"] == pytest.approx(20.0)
    assert report["wall_time"]["source"].startswith("events.jsonl")
    assert report["attempts"] == [] and report["fabric"] == "not recorded"


def test_a_run_that_has_not_finished_or_evaluated_says_so(tmp_path, capsys):
    folder = write_run(tmp_path / "run", events=[_event(19, 1.5, 0.01)], metrics=None)
    assert main(["report", str(folder), "--write"]) == 0
    out = capsys.readouterr().out
    assert "(not finished: 20 of 40)" in out and "not evaluated (no metrics.json)" in out
    assert "no data in events.jsonl" in (folder / "report.html").read_text()  # no AP curve


def _bad(tmp_path: Path, capsys, folder: Path) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(folder)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: (f / "plan.json").unlink(), "not a run's output folder (no plan.json"),
        (lambda f: (f / "plan.json").write_text("{not json"), "plan.json: not valid JSON (line 1"),
        (lambda f: (f / "plan.json").write_text("[1]"), "plan.json: expected a JSON object"),
        (
            lambda f: (f / "plan.json").write_text(json.dumps(dict(PLAN, max_iter="40"))),
            "plan.json: 'max_iter' missing or not a whole number",
        ),
        (
            lambda f: (f / "plan.json").write_text(
                json.dumps(dict(SEGMENTED, segments=[SEGMENTED["segments"][0], {"world_size": 4}]))
            ),
            "plan.json: segments[1].global_batch missing or not a whole number",
        ),
        (lambda f: (f / "metrics.json").write_text(""), "metrics.json: not valid JSON"),
        (
            lambda f: (f / "events.jsonl").write_text("oops\n" + _event(19, 1.0, 0.01) + "\nno\n"),
            "events.jsonl: line 3 is not JSON (Expecting value); 2 such lines, more than the 1",
        ),
        (
            lambda f: (f / "events.jsonl").write_text("[1, 2]\n"),
            "events.jsonl: line 1 is not a detectron2 event",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_file_and_exit_2(tmp_path, capsys, change, message):
    folder = write_run(tmp_path / "run")
    change(folder)
    err = _bad(tmp_path, capsys, folder)
    assert err.startswith("megdet report: error: ") and message in err, err


def test_a_missing_folder_is_exit_2(tmp_path, capsys):
    err = _bad(tmp_path, capsys, tmp_path / "nowhere")
    assert f"{tmp_path / 'nowhere'}: no such folder" in err


def test_an_unwritable_folder_is_exit_1_after_printing_the_report(tmp_path, capsys, monkeypatch):
    folder = write_run(tmp_path / "run")

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_text", refuse)
    assert main(["report", str(folder), "--write"]) == 1
    captured = capsys.readouterr()
    assert "(finished)" in captured.out
    assert f"cannot write into {folder}: Permission denied" in captured.err


def test_megdet_report_imports_no_torch(tmp_path):
    folder = write_run(tmp_path / "run")
    code = (
        "import sys; from megdet.cli import main; main(['report', sys.argv[1], '--write']); "
        "assert not {'torch', 'detectron2'} & set(sys.modules), 'torch imported'"
    )
    result = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (folder / "report.html").is_file()


def test_the_report_reads_the_files_the_trainer_writes():
    from megdet.trainer import report
    from megdet.trainer.engine import EVENTS_FILE
    from megdet.trainer.evaluation import METRICS_FILE

    assert (report.EVENTS_FILE, report.METRICS_FILE) == (EVENTS_FILE, METRICS_FILE)


@pytest.mark.parametrize(("iteration", "written"), [(40, True), (41, True), (25, False)])
def test_the_hook_writes_the_report_only_when_training_finished(tmp_path, iteration, written):
    from megdet.trainer.report_hook import WriteReport

    folder = write_run(tmp_path / "run")
    hook = WriteReport(str(folder))
    hook.trainer = SimpleNamespace(iter=iteration, max_iter=40)
    hook.after_train()
    assert (folder / "report.json").is_file() is written
    assert (folder / "report.html").is_file() is written
    assert (hook.report is not None) is written  # what the final progress report carries


def test_the_final_progress_reports_totals_are_the_reports_attempts_and_wall_time(tmp_path):
    from megdet.trainer.report import report_totals

    report = build_report(write_run(tmp_path / "run"))
    # The parts of test_a_finished_run_reports_ap_images_wall_time_attempts_and_fabric.
    assert report_totals(report) == {
        "attempts": 1, "wallSeconds": 12, "setupSeconds": 2, "stepsSeconds": 6,
        "hooksSeconds": 1, "evaluationSeconds": 2, "stepsImagesPerSecond": pytest.approx(80 / 6),
    }  # fmt: skip
    # A part the log does not have is left out, not sent as 0.
    report["wall_time"] |= {"hooks_s": None, "evaluation_s": None}
    report["images_per_second"]["steps"] = None
    assert set(report_totals(report)) == {"attempts", "wallSeconds", "setupSeconds",
                                          "stepsSeconds"}  # fmt: skip
    assert report_totals({"attempts": [], "wall_time": {}}) == {}


def test_the_hook_turns_a_bad_folder_into_a_warning(tmp_path, captured_warnings, caplog):
    from megdet.trainer.report_hook import WriteReport

    folder = write_run(tmp_path / "run")
    (folder / "plan.json").write_text("{")
    hook = WriteReport(str(folder))
    hook.trainer = SimpleNamespace(iter=40, max_iter=40)
    with captured_warnings("megdet.trainer.report_hook"):
        hook.after_train()
    assert "No run report written" in caplog.text and "plan.json: not valid JSON" in caplog.text
    assert not (folder / "report.json").exists()


def test_a_same_world_resume_is_a_segment_too_and_an_older_checkpoint_has_no_world(tmp_path):
    # trainer/elastic.py adds a segment at every resume; a checkpoint from before the run state
    # gives a first segment without a world size. Killed after its checkpoint at 19, the first
    # attempt logged iteration 29 too: the second attempt's 29 replaces it.
    segments = [
        {"world_size": None, "global_batch": 8, "first_iter": 0, "last_iter": 19,
         "images_start": 0, "images_end": 160},
        {"world_size": 2, "global_batch": 8, "accumulation_steps": 1, "lr": 0.01,
         "resize": "keep-batch", "first_iter": 20, "last_iter": 39, "images_start": 160,
         "images_end": 320},
    ]  # fmt: skip
    plan = dict(PLAN, start_iter=20, images_done=160, segments=segments)
    events = [_event(19, 2.0, 0.01), _event(29, 9.0, 0.01), _event(29, 1.0, 0.01),
              _event(39, 0.5, 0.001)]  # fmt: skip
    report = build_report(write_run(tmp_path / "run", plan, events))
    assert report["curves"]["loss"] == [[160, 19, 2.0], [240, 29, 1.0], [320, 39, 0.5]]
    assert report["segments"][0]["world_size"] is None
    page = render_page(report)
    assert "? GPUs</text>" not in page and "2 GPUs</text>" in page
    assert "0-19  x-  batch 8  accum -" in format_report(report)
