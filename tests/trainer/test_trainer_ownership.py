"""Two runs never share an output folder by accident: the run stamp (.megdet-run.json)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from trainer_dist import run_distributed

from tests.tiny_train import train_command

RUN_A = {"MEGDET_RUN_UID": "0b6f-run-a", "MEGDET_RUN_NAME": "run-a"}
RUN_B = {"MEGDET_RUN_UID": "7c21-run-b", "MEGDET_RUN_NAME": "run-b"}
LOCAL: dict[str, str] = {}


def _claim(folder, env, resume_from=""):
    from megdet.trainer.ownership import claim, identity_from_env

    return claim(folder, identity_from_env(env), resume_from)


def _stamp(folder) -> dict:
    from megdet.trainer.ownership import STAMP_FILE

    return json.loads((Path(folder) / STAMP_FILE).read_text())


def _contents(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}


def test_a_new_folder_is_stamped_with_the_runs_identity(tmp_path):
    decision = _claim(tmp_path, RUN_A)
    assert decision.action == "create"
    stamp = _stamp(tmp_path)
    assert stamp["uid"] == "0b6f-run-a" and stamp["name"] == "run-a"
    assert stamp["origin"] == "cluster" and stamp["history"] == []
    assert stamp["created"].endswith("Z")
    assert [p.name for p in tmp_path.iterdir()] == [".megdet-run.json"]  # no temporary left


def test_the_same_run_continues_and_leaves_the_stamp_alone(tmp_path):
    _claim(tmp_path, RUN_A)
    before = _contents(tmp_path)
    assert _claim(tmp_path, RUN_A).action == "continue"  # a restarted pod
    assert _contents(tmp_path) == before


def test_another_cluster_run_is_refused_naming_the_owner_and_the_fix(tmp_path):
    from megdet.trainer.ownership import OwnershipError

    _claim(tmp_path, RUN_A)
    (tmp_path / "model_0000099.pth").write_bytes(b"run a's checkpoint")
    before = _contents(tmp_path)
    for env in (RUN_B, LOCAL):  # a second MegDetRun, or a local run on the volume
        with pytest.raises(OwnershipError) as err:
            _claim(tmp_path, env)
        message = str(err.value)
        assert message.startswith(f"OUTPUT_DIR: {tmp_path} belongs to run 'run-a' (uid 0b6f-run-a")
        assert "set MEGDET.RESUME_FROM 0b6f-run-a (or run-a)" in message
        assert "spec.resumeFrom" in message
        assert _contents(tmp_path) == before
    with pytest.raises(OwnershipError, match=r"MEGDET\.RESUME_FROM 'run-c' names neither"):
        _claim(tmp_path, RUN_B, resume_from="run-c")
    assert _contents(tmp_path) == before


@pytest.mark.parametrize("resume_from", ["0b6f-run-a", "run-a"])
def test_resume_from_adopts_the_folder_and_keeps_the_previous_owner(tmp_path, resume_from):
    from megdet.trainer.ownership import OwnershipError

    _claim(tmp_path, RUN_A)
    first = _stamp(tmp_path)
    (tmp_path / "model_0000099.pth").write_bytes(b"run a's checkpoint")
    decision = _claim(tmp_path, RUN_B, resume_from=resume_from)
    assert decision.action == "adopt"
    stamp = _stamp(tmp_path)
    assert stamp["uid"] == "7c21-run-b" and stamp["name"] == "run-b"
    assert stamp["origin"] == "cluster"
    (previous,) = stamp["history"]
    assert {k: previous[k] for k in first if k != "history"} == {
        k: v for k, v in first.items() if k != "history"
    }
    assert previous["adopted"]
    assert (tmp_path / "model_0000099.pth").read_bytes() == b"run a's checkpoint"
    # Run B now owns it: B continues, A is refused, and a third adoption keeps both owners.
    assert _claim(tmp_path, RUN_B).action == "continue"
    with pytest.raises(OwnershipError, match="belongs to run 'run-b'"):
        _claim(tmp_path, RUN_A)
    _claim(tmp_path, RUN_A, resume_from="run-b")
    assert [h["uid"] for h in _stamp(tmp_path)["history"]] == ["0b6f-run-a", "7c21-run-b"]


def test_local_runs_share_their_folder_and_a_cluster_run_adopts_it(tmp_path):
    first = _claim(tmp_path, LOCAL)
    stamp = _stamp(tmp_path)
    assert first.action == "create" and stamp["origin"] == "local" and len(stamp["uid"]) == 32
    assert _claim(tmp_path, LOCAL).action == "continue"  # `make demo` again, a local resume
    assert _stamp(tmp_path) == stamp
    assert _claim(tmp_path, RUN_A).action == "adopt"  # local stamps are not protected
    assert _stamp(tmp_path)["history"][0]["uid"] == stamp["uid"]
    assert _claim(tmp_path, RUN_A).action == "continue"


def test_a_folder_from_before_stamps_is_stamped_and_its_files_kept(tmp_path):
    (tmp_path / "model_final.pth").write_bytes(b"old")
    assert _claim(tmp_path, RUN_A).action == "create"
    assert (tmp_path / "model_final.pth").read_bytes() == b"old"


@pytest.mark.parametrize("content", ["{not json", "[]", '{"name": "x"}'])
def test_an_unreadable_stamp_is_refused_not_overwritten(tmp_path, content):
    from megdet.trainer.ownership import STAMP_FILE, OwnershipError

    (tmp_path / STAMP_FILE).write_text(content)
    with pytest.raises(OwnershipError, match="is not a run stamp"):
        _claim(tmp_path, RUN_A, resume_from="run-a")
    assert (tmp_path / STAMP_FILE).read_text() == content


def test_of_two_runs_stamping_an_empty_folder_at_once_one_wins(tmp_path, monkeypatch):
    from megdet.trainer import ownership

    # Run B reads "no stamp", then run A stamps the folder before B writes.
    real_read = ownership.read_stamp
    reads = []

    def read_then_a_stamps(folder):
        stamp = real_read(folder)
        if not reads:
            ownership.write_stamp(
                folder, ownership.decide(folder, None, _id(RUN_A), "").stamp, True
            )
        reads.append(stamp)
        return stamp

    monkeypatch.setattr(ownership, "read_stamp", read_then_a_stamps)
    with pytest.raises(ownership.OwnershipError, match="belongs to run 'run-a'"):
        _claim(tmp_path, RUN_B)
    assert _stamp(tmp_path)["uid"] == "0b6f-run-a"


def test_a_folder_that_cannot_be_stamped_is_a_clear_error(tmp_path, monkeypatch):
    from megdet.trainer import ownership

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(ownership, "write_stamp", read_only)
    with pytest.raises(ownership.OwnershipError, match="cannot write the run stamp in"):
        ownership.claim_output_folder(str(tmp_path), "")


def _id(env):
    from megdet.trainer.ownership import identity_from_env

    return identity_from_env(env)


@pytest.mark.parametrize("uid", ["has space", "x" * 129, "-leading-dash", "a/b"])
def test_a_malformed_run_uid_is_a_clear_error(uid):
    from megdet.trainer.config import ConfigError
    from megdet.trainer.ownership import identity_from_env

    with pytest.raises(ConfigError, match=r"^MEGDET_RUN_UID: .* is invalid: expected the "):
        identity_from_env({"MEGDET_RUN_UID": uid})


def test_resume_from_must_be_a_string():
    from megdet.trainer.config import ConfigError, load_config

    cfg = load_config("megdet_tiny_cpu", ["MEGDET.RESUME_FROM", "run-a"])
    assert cfg.MEGDET.RESUME_FROM == "run-a"
    with pytest.raises(ConfigError, match=r"^MEGDET\.RESUME_FROM: "):
        load_config("megdet_tiny_cpu", ["MEGDET.RESUME_FROM", "[1, 2]"])


# --- megdet train ----------------------------------------------------------------------------


def test_megdet_train_refuses_another_runs_folder_before_writing_anything(
    tmp_path, shapes, capsys, monkeypatch
):
    from megdet.cli import main

    out = tmp_path / "out"
    out.mkdir()
    _claim(out, RUN_A)
    (out / "log.txt").write_text("run a's log\n")
    (out / "model_0000099.pth").write_bytes(b"run a's checkpoint")
    before = _contents(out)
    for key, value in RUN_B.items():
        monkeypatch.setenv(key, value)
    code = main(
        ["train", "--config", "megdet_tiny_cpu", "--output", str(out),
         "--train-json", str(shapes["train_json"]), "--train-images", str(shapes["train_images"])]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert err.startswith(f"megdet train: error: OUTPUT_DIR: {out} belongs to run 'run-a'"), err
    assert "Traceback" not in err
    assert _contents(out) == before  # no log line, no config.yaml, nothing replaced


def _claim_on_rank(rank: int, world: int, folder: str, env: dict, expect_error: bool) -> None:
    from megdet.trainer import ownership

    os.environ.update(env)
    if rank == 0:
        real_claim = ownership.claim

        def slow_claim(*args):
            time.sleep(1.0)  # rank 1 must wait for this, not read or write the folder meanwhile
            return real_claim(*args)

        ownership.claim = slow_claim
    try:
        message = ownership.claim_output_folder(folder, "")
    except ownership.OwnershipError as err:
        assert expect_error, err
        message = f"refused: {err}"
    else:
        assert not expect_error
        # Rank 0 stamped the folder before any rank got past the claim.
        assert (Path(folder) / ownership.STAMP_FILE).exists()
    Path(folder, f"rank{rank}.txt").write_text(message)


@pytest.mark.slow
def test_every_rank_waits_for_rank_0s_stamp_and_shares_its_verdict(tmp_path):
    run_distributed(2, _claim_on_rank, str(tmp_path), RUN_A, False)
    stamp = _stamp(tmp_path)
    assert stamp["uid"] == "0b6f-run-a"
    messages = {(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)}
    assert messages == {f"Stamped {tmp_path} for run 'run-a' (uid 0b6f-run-a, cluster, "
                        f"stamped {stamp['created']})"}  # fmt: skip

    for name in ("rank0.txt", "rank1.txt"):
        (tmp_path / name).unlink()
    run_distributed(2, _claim_on_rank, str(tmp_path), RUN_B, True)
    messages = {(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)}
    assert len(messages) == 1 and "belongs to run 'run-a'" in messages.pop()
    assert _stamp(tmp_path) == stamp


@pytest.mark.slow
def test_a_cluster_run_restarts_in_its_folder_and_another_adopts_it_with_resume_from(
    shapes, tmp_path
):
    out = tmp_path / "run"

    def train(env: dict, *overrides: str) -> subprocess.CompletedProcess:
        cmd = train_command(
            shapes, out,
            "SOLVER.MAX_ITER", "3", "SOLVER.STEPS", "(2,)", "SOLVER.WARMUP_ITERS", "1",
            *overrides,
            workers=None, val=False,
        )  # fmt: skip
        clean = {k: v for k, v in os.environ.items() if not k.startswith("MEGDET_RUN_")}
        return subprocess.run(cmd, env={**clean, **env}, capture_output=True, text=True,
                              timeout=600)  # fmt: skip

    first = train(RUN_A)
    assert first.returncode == 0, first.stderr[-3000:]
    assert _stamp(out)["uid"] == "0b6f-run-a"
    final = (out / "model_final.pth").read_bytes()

    again = train(RUN_A)  # the same run's pod restarted: continues (finished: nothing to do)
    assert again.returncode == 0, again.stderr[-3000:]

    refused = train(RUN_B)
    assert refused.returncode == 2
    assert f"megdet train: error: OUTPUT_DIR: {out} belongs to run 'run-a'" in refused.stderr
    assert "Traceback" not in refused.stderr

    adopted = train(RUN_B, "MEGDET.RESUME_FROM", "run-a")
    assert adopted.returncode == 0, adopted.stderr[-3000:]
    stamp = _stamp(out)
    assert stamp["uid"] == "7c21-run-b" and stamp["history"][0]["uid"] == "0b6f-run-a"
    assert "Adopted" in (out / "log.txt").read_text()
    assert (out / "model_final.pth").read_bytes() == final  # resumed the finished run
