"""bench/first_iteration.py without a cluster: its arguments, the floor's program and pod, the
parts of a floor and a run from a recorded sample, the medians, the ratio and the report."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest

from bench import first_iteration as bench

T0 = 1_796_548_900.0  # the bench's create


def floor_record() -> dict:
    return {"name": "floor-1", "role": None, "added": T0 + 0.1, "scheduled": T0 + 0.3}


def test_floor_parts_from_the_watch_and_the_pods_line() -> None:
    pod = {**floor_record(), "running": T0 + 1.8, "terminated": T0 + 9.0}
    info = {
        "start": T0 + 2.0,
        "imported": T0 + 7.5,
        "mapped_files": 96,
        "mapped_mb": 3175.4,
        "nvidia": ["cu13", "cudnn"],
        "read_mb": 40.0,
    }
    lines = [(T0 + 1.9, "noise"), (T0 + 7.6, "megdet-floor " + json.dumps(info))]
    sample = bench.floor_sample(T0, pod, lines)
    assert sample["parts"] == pytest.approx(
        {"scheduling": 0.3, "container start": 1.5, "imports": 5.8}
    )
    assert sample["total"] == pytest.approx(7.6)
    assert sum(sample["parts"].values()) == pytest.approx(sample["total"])
    assert sample["import_s"] == pytest.approx(5.5)
    assert sample["mapped_files"] == 96 and sample["nvidia"] == ["cu13", "cudnn"]


MASTER_LOG = [
    (T0 + 6.0, "megdet doctor"),
    (T0 + 6.1, "megdet launch: world size 2: /opt/venv/bin/python3.11 -m torch.distributed.run"),
    (T0 + 20.0, "[12/06 09:22:40 megdet.trainer]: Starting a new run in /output/first-1"),
    (T0 + 23.0, "[12/06 09:22:43 d2.engine.train_loop]: Starting training from iteration 0"),
    (T0 + 25.0, "[12/06 09:22:45 fvcore.common.checkpoint]: Saving checkpoint to /output/m_0.pth"),
    (T0 + 27.0, "[12/06 09:22:47 fvcore.common.checkpoint]: Saving checkpoint to /output/m_1.pth"),
    (T0 + 60.0, "[12/06 09:23:20 d2.engine.hooks]: Total training time: 0:00:36"),
    (T0 + 61.0, "[12/06 09:23:21 d2.evaluation.testing]: copypaste: AP,AP50,AP75"),
    (T0 + 61.5, "[12/06 09:23:21 d2.evaluation.testing]: copypaste: 1.2,11.9,0.0"),
]


def run_pods() -> list[dict]:
    common = {"role": "master", "name": "first-1-master-0"}
    master = {**common, "added": T0 + 1.0, "scheduled": T0 + 1.2, "running": T0 + 3.0}
    worker = {"role": "worker", "name": "first-1-worker-0", "added": T0 + 1.1}
    worker.update(scheduled=T0 + 1.5, running=T0 + 4.0)
    master["terminated"], worker["terminated"] = T0 + 63.0, T0 + 62.0
    return [master, worker]


def status(first: str | None = "2026-12-06T09:22:45Z") -> dict:
    progress = {"firstIterationTime": first} if first else {}
    return {"phase": "Succeeded", "progress": progress, "startup": {"totalSeconds": 24}}


def test_run_parts_from_a_recorded_sample() -> None:
    # The trainer's whole-second first-iteration stamp: its middle is taken.
    sample = bench.run_sample(T0, run_pods(), MASTER_LOG, status())
    assert sample["parts"] == pytest.approx(
        {
            "controller": 1.0,  # the first pod seen
            "scheduling": 0.5,  # to the last one scheduled
            "container start": 2.5,  # the last scheduled to the last running
            "launch + rendezvous": 16.0,  # to the trainer's first line
            "data + model": 3.0,  # to "Starting training from iteration"
            "first iteration": 2.0,  # to the first iteration's checkpoint line
        }
    )
    assert sample["total"] == pytest.approx(25.0)
    assert sum(sample["parts"].values()) == pytest.approx(sample["total"])
    assert sample["end"] == pytest.approx({"training": 35.0, "evaluation": 1.5, "finish": 1.5})
    assert sample["to_end"] == pytest.approx(63.0)
    assert sample["torchrun_to_trainer_s"] == pytest.approx(13.9)
    assert sample["startup"] == {"totalSeconds": 24}
    reported = datetime(2026, 12, 6, 9, 22, 45, tzinfo=UTC).timestamp()
    assert sample["reported_first_iteration"] == reported
    assert bench.run_sample(T0, run_pods(), MASTER_LOG, status(None))["total"] == 25.0


def test_a_run_without_its_signals_is_a_clear_error() -> None:
    no_checkpoint = [line for line in MASTER_LOG if "Saving checkpoint" not in line[1]]
    with pytest.raises(ValueError, match="'Saving checkpoint to' line after the first"):
        bench.run_sample(T0, run_pods(), no_checkpoint, status())
    no_eval = [line for line in MASTER_LOG if "copypaste" not in line[1]]
    with pytest.raises(ValueError, match="'copypaste:'"):
        bench.run_sample(T0, run_pods(), no_eval, status())


def sample(total: float, parts: dict, **extra) -> dict:
    return {"total": total, "parts": parts, **extra}


def test_medians_ratio_and_the_largest_part() -> None:
    floors = [
        sample(t, {"scheduling": 0.1, "container start": c, "imports": t - 0.1 - c})
        for t, c in ((10.0, 1.0), (12.0, 2.0), (30.0, 1.0))
    ]
    run_parts = dict.fromkeys(bench.RUN_PARTS, 1.0)
    runs = [
        sample(t, {**run_parts, "launch + rendezvous": r}, end=dict.fromkeys(bench.END_PARTS, 2.0))
        for t, r in ((20.0, 14.0), (40.0, 30.0), (18.0, 12.0))
    ]
    for run in runs:
        run["to_end"] = run["total"] + 40
    summary = bench.summarize(floors, runs)
    assert summary["floor"]["total"] == 12.0 and summary["run"]["total"] == 20.0
    assert summary["floor"]["parts"]["container start"] == 1.0
    assert summary["run"]["parts"]["launch + rendezvous"] == 14.0
    assert summary["run"]["to_end"] == 60.0
    assert summary["ratio"] == pytest.approx(20.0 / 12.0)
    assert summary["largest"] == "launch + rendezvous"
    with pytest.raises(ValueError, match="at least one"):
        bench.summarize([], runs)


def test_report_names_the_ratio_against_the_goal_and_the_largest_part() -> None:
    floor = {
        "parts": {"scheduling": 0.1, "container start": 1.0, "imports": 8.9},
        "total": 10.0,
        "import_s": 8.0,
        "mapped_files": 96,
        "mapped_mb": 3175.0,
    }
    run = {
        "parts": dict.fromkeys(bench.RUN_PARTS, 2.0),
        "total": 12.0,
        "end": dict.fromkeys(bench.END_PARTS, 1.0),
        "to_end": 50.0,
        "startup": {"totalSeconds": 12},
    }
    result = {
        "floors": [floor],
        "runs": [run],
        "imports": [("/x/megdet-train-ci-1.oci.tar", 3_313_703_936, 100.0)],
        "load": "1.00, 1.00, 1.00 (on 2 cores)",
    }
    result["summary"] = bench.summarize(result["floors"], result["runs"])
    text = bench.format_report(result)
    assert "megdet-train-ci-1.oci.tar 3,314 MB in 100.0 s (33 MB/s)" in text
    assert "run / floor (medians of the totals): 1.20 (within the 1.5 goal)" in text
    assert "largest part: controller" in text
    assert "#1: 0.10 | 1.00 | 8.90 | total 10.00 s" in text
    run["total"] = 20.0
    result["summary"] = bench.summarize(result["floors"], result["runs"])
    assert "2.00 (above the 1.5 goal)" in bench.format_report(result)


def test_arguments(tmp_path, capsys) -> None:
    archive = tmp_path / "train-ci.oci.tar"
    archive.write_bytes(b"x")
    args = bench.parse_args(["--image", str(archive), "--repeats", "2"])
    assert args.repeats == 2 and args.image == archive and args.also_import == []
    with pytest.raises(SystemExit):
        bench.parse_args(["--image", str(archive), "--repeats", "0"])
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--image", str(tmp_path / "none.tar")])
    assert "no image archive at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args([])
    assert "--image is required (or --report RESULT_JSON)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--image", str(archive), "--max-iter", "1"])
    assert "--max-iter must be at least 2, got 1" in capsys.readouterr().err
    assert bench.parse_args(["--report", str(archive)]).report == archive


def test_the_floor_pod_meets_the_restricted_level_and_runs_only_the_imports() -> None:
    values = {
        "resources": {"cpu": "500m", "memory": "2Gi"},
        "nodeSelector": {"megdet.io/real-node": "true"},
        "tolerations": [{"key": "megdet.io/real-node", "operator": "Equal", "value": "true"}],
    }
    pod = bench.floor_pod("floor-1", "ghcr.io/megdet/megdet:0.1.0-ci", values)
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["imagePullPolicy"] == "Never"
    assert container["command"][:2] == ["python", "-c"]
    assert spec["nodeSelector"] == values["nodeSelector"]
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "2Gi"}


def test_the_floor_program_prints_the_line_the_bench_reads() -> None:
    # The real program, in this venv (the same torch wheel as the image's).
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", bench.FLOOR_CODE], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    lines = [(time.time(), line) for line in proc.stdout.splitlines()]
    pod = {"scheduled": started, "running": started}
    sample = bench.floor_sample(started, pod, lines)
    assert 0 < sample["import_s"] < sample["total"]
    assert sample["mapped_files"] > 10 and sample["mapped_mb"] > 1


@pytest.mark.parametrize("max_iter", [2, 4, 30])
def test_the_runs_spec_is_the_tiny_run_cut_to_a_valid_length(max_iter, tmp_path) -> None:
    import yaml
    from e2e_helpers import mdr  # on the path bench.first_iteration sets

    from megdet.cli import main

    spec = bench.run_spec("ghcr.io/megdet/megdet:0.1.0-ci", max_iter)
    assert spec["maxIter"] == max_iter and spec["gpus"] == 2 and "runName" not in spec
    assert spec["steps"] == [max_iter - 1] and spec["warmupIters"] < max_iter
    assert spec["extraOverrides"]["SOLVER.CHECKPOINT_PERIOD"] == 1
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(mdr("first-1", bench.NS, spec)))
    assert main(["validate", "-q", "-f", str(path)]) == 0


def test_a_processs_start_kind_and_pod() -> None:
    # /proc/<pid>/stat: the command may hold spaces and parentheses; field 22 is the start.
    stat = "4242 (python3.11 (x)) R 1 4242 42 0 -1 4194304 127 0 0 0 0 0 0 0 20 0 1 0 1500 31334"
    assert bench.process_start(stat, boot_time=1000.0, ticks=100) == 1015.0
    torchrun = "/opt/venv/bin/python3.11 -m torch.distributed.run --nnodes=2:2 -m megdet train"
    assert bench.process_kind(torchrun) == "torchrun"
    assert bench.process_kind("/opt/venv/bin/python3.11 -u -m megdet train --config x") == "trainer"
    assert bench.process_kind("/usr/bin/tini -- megdet launch train --config x") is None
    uid = "5d79011c-8446-43c8-b303-4c1184698b61"
    cgroupfs = f"0::/megdet-node/kubepods/burstable/pod{uid}/0123abcd\n"
    systemd = f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-x.scope\n"
    assert bench.pod_of_cgroup(cgroupfs) == uid and bench.pod_of_cgroup(systemd) == uid
    assert bench.pod_of_cgroup("0::/user.slice/session-1.scope\n") is None


def test_the_masters_launch_split_by_its_processes() -> None:
    master = {"running": T0 + 3.0}
    starts = {"torchrun": T0 + 9.0, "trainer": T0 + 30.0}
    split = bench.launch_split(master, starts, first_line=T0 + 40.0)
    assert split == pytest.approx(
        {"launcher": 6.0, "torchrun + rendezvous": 21.0, "trainer start": 10.0}
    )
    # Together they are the part they split: the Master's running to the trainer's first line.
    assert sum(split.values()) == pytest.approx(37.0)
    assert bench.launch_split(master, {"torchrun": T0 + 9.0}, T0 + 40.0) == {}
