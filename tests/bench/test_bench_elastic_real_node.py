"""bench/elastic_real_node.py's reading of its signals, without a cluster: containerd's log
timestamps, the trainer's own lines, and the controller's writes in the audit log; and the CLI
the real-node benchmarks share."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bench import elastic_real_node as bench

T0 = datetime(2026, 12, 6, 8, 42, 4, tzinfo=UTC).timestamp()


def test_timestamps_keep_their_fraction() -> None:
    assert bench._stamp("2026-12-06T08:42:04Z") == T0
    assert bench._stamp("2026-12-06T08:42:04.250000Z") == pytest.approx(T0 + 0.25)
    assert bench._stamp("2026-12-06T08:42:04.123456789Z") == pytest.approx(T0 + 0.123456789)


def test_log_lines_and_the_trainers_own(tmp_path) -> None:
    log = tmp_path / "master.log"
    log.write_text(
        "2026-12-06T08:42:04.5Z megdet launch: world size 2: torchrun ...\n"
        "2026-12-06T08:42:06.25Z [12/06 08:42:06 megdet.trainer]: Resuming after 44 images\n"
        "not a stamped line\n"
        "2026-12-06T08:42:08Z WARNING [12/06 08:42:08 megdet.trainer.engine]: Saved a checkpoint\n"
        "2026-12-06T08:42:09Z [12/06 08:42:09 d2.engine.train_loop]: Starting training "
        "from iteration 11\n"
    )
    assert [t - T0 for t, _ in bench.log_lines(str(log))] == pytest.approx([0.5, 2.25, 4.0, 5.0])
    # The launcher's line is not the trainer's; a warning is.
    assert [t - T0 for t, _ in bench.trainer_lines(str(log))] == pytest.approx([2.25, 4.0, 5.0])
    assert bench.first_line(str(log), "Starting training") - T0 == pytest.approx(5.0)
    assert bench.first_line(str(log), "Resuming", after=T0 + 3) is None


class FakeAudit:
    def __init__(self, events: list[dict]) -> None:
        self.events = events

    def audit_events(self, user: str | None = None) -> list[dict]:
        return [e for e in self.events if e["user"]["username"] == user]


def event(verb: str, at: str, **extra) -> dict:
    return {
        "user": {"username": extra.pop("user", bench.CONTROLLER_USER)},
        "verb": verb,
        "stage": extra.pop("stage", "ResponseComplete"),
        "objectRef": {"resource": extra.pop("resource", "pytorchjobs"), **extra},
        "requestReceivedTimestamp": f"2026-12-06T08:42:{at}Z",
    }


def test_controller_writes_are_its_own_on_the_job_after_the_patch() -> None:
    kube = FakeAudit(
        [
            event("delete", "01.000000"),  # before the patch
            event("delete", "05.500000"),
            event("delete", "06.000000", user="kubeflow-operators"),
            event("delete", "06.100000", resource="pods"),
            event("patch", "06.200000", subresource="status"),
            event("patch", "06.300000"),
            event("delete", "06.400000", stage="ResponseStarted"),
        ]
    )
    assert [t - T0 for t in bench.controller_writes(kube, "delete", T0)] == pytest.approx([1.5])
    assert [t - T0 for t in bench.controller_writes(kube, "patch", T0)] == pytest.approx([2.3])


def test_the_report_lists_each_change_and_segment(capsys) -> None:
    parts = dict.fromkeys(("react", "checkpoint", "job down", "pods up", "rendezvous", "data"), 1.0)
    segment = {
        "world_size": 2,
        "global_batch": 4,
        "accumulation_steps": 1,
        "first_iter": 0,
        "last_iter": 10,
        "images_start": 0,
        "images_end": 44,
    }
    bench.print_report(
        {
            "phase": "Succeeded",
            "attempt": 3,
            "max_iter": 50,
            "images_seen": 200,
            "load": "1, 1, 1",
            "changes": [
                {"kind": "suspend", "gpus": None, "parts": parts, "total": 6.0, "lost_images": 0,
                 "away": 0.5, "pods_created_after_s": 0.2},
                {"kind": "resize", "gpus": 1, "parts": parts, "total": 6.0, "lost_images": 0,
                 "job_created_after_s": 0.1, "pods_created_after_s": 0.2},
            ],
            "segments": [segment],
        }
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "suspend+resume | 1.0 | 1.0 | 1.0 | 1.0 | 1.0 | 1.0 | 6.0 | 0" in out
    assert "resize to 1 | " in out and '"job_created_after_s": 0.1' in out
    assert "segment: 2 workers, batch 4 (accumulation 1), iterations 0-10, images 0-44" in out


def test_the_real_node_benchmarks_share_image_workdir_and_json(tmp_path) -> None:
    parser = bench.real_node_parser("Doc line.\nMore.", "bench-x", "where", "archive")
    args = parser.parse_args([])
    assert (args.image, args.workdir, args.json) == (None, bench.ROOT / "output" / "bench-x", False)
    archive = tmp_path / "train-ci.oci.tar"
    args = parser.parse_args(["--image", str(archive), "--workdir", str(tmp_path), "--json"])
    assert (args.image, args.workdir, args.json) == (archive, tmp_path, True)
    assert parser.description == "Doc line."
