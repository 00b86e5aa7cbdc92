"""The image build's disk preflight (imagebuild/disk.py): a build the free space cannot hold is
refused before the engine starts, naming the need, the free space and the way out."""

from __future__ import annotations

import subprocess
from collections import namedtuple

import pytest

import imagebuild.build as b
from imagebuild import disk

Usage = namedtuple("Usage", "total used free")


def free_gib(monkeypatch: pytest.MonkeyPatch, gib: float) -> None:
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda _p: Usage(0, 0, int(gib * disk.GIB)))


@pytest.mark.parametrize(
    ("target", "cached", "need"),
    [("train", True, 23), ("train", False, 30), ("controller", False, 2)],
)
def test_a_training_build_needs_its_measured_peak_and_a_first_one_its_build_stage_too(
    target: str, cached: bool, need: float
) -> None:
    assert disk.need_gib(target, cached, {}) == need


def test_the_need_can_be_set_and_a_bad_setting_names_the_variable() -> None:
    assert disk.need_gib("train", False, {disk.FREE_ENV: "0"}) == 0
    assert disk.need_gib("train", True, {disk.FREE_ENV: " 40.5 "}) == 40.5
    for bad in ("lots", "-1", "nan"):
        with pytest.raises(ValueError, match=rf"{disk.FREE_ENV}='{bad}': give a number of GiB"):
            disk.need_gib("train", True, {disk.FREE_ENV: bad})


def test_too_little_space_says_how_much_is_needed_and_free_and_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    free_gib(monkeypatch, 10.04)
    problem = disk.shortfall(tmp_path / "not" / "made" / "yet", 23, "train-ci's build")
    assert problem is not None
    assert problem.startswith("train-ci's build needs about 23 GiB free on the file system of ")
    assert "which has 10.0 GiB free" in problem
    assert "MEGDET_IMAGE_CACHE" in problem and disk.FREE_ENV in problem
    assert disk.shortfall(tmp_path, 10, "x") is None
    assert disk.shortfall(tmp_path, 0, "x") is None


def test_the_build_is_refused_before_the_engine_runs(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("MEGDET_IMAGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(disk.FREE_ENV, raising=False)
    monkeypatch.setattr(b, "ensure_tools", lambda: None)
    monkeypatch.setattr(b, "clear_stale_containers", lambda _env: 0)
    monkeypatch.setattr(b, "image_exists", lambda _name, _env: True)

    def no_engine(*args, **kwargs):
        pytest.fail(f"the engine ran: {args[0]}")

    monkeypatch.setattr(subprocess, "run", no_engine)
    stale = b.archive_path(tmp_path / "cache" / "archives", b.VARIANTS["train-ci"], "0" * 64)
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an older build")
    free_gib(monkeypatch, 5)
    assert b.main(["train-ci", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("image: error: train-ci's build needs about 23 GiB free"), err
    assert "Traceback" not in err
    assert not stale.exists()  # an older archive of the variant goes first: space for this one
    free_gib(monkeypatch, 22.9)
    monkeypatch.setenv(disk.FREE_ENV, "x")
    assert b.main(["train-ci", "--output", str(tmp_path / "out")]) == 2
    assert f"{disk.FREE_ENV}='x'" in capsys.readouterr().err
