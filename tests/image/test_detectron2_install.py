"""imagebuild/detectron2_install.py: the build stage's detectron2 step, without a build."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest

from imagebuild import detectron2_install as d2

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"


def test_an_unknown_source_is_a_clear_error(capsys):
    assert d2.main(["--pyproject", str(PYPROJECT), "--source", "svn"]) == 2
    assert "--source: 'svn' is not one of: git, pypi" in capsys.readouterr().err


def test_a_short_commit_is_refused(tmp_path):
    with pytest.raises(d2.InstallError, match="--commit: 'abc123' is not a full"):
        d2.fetch_source("https://example.invalid/repo", "abc123", tmp_path / "src")


def _repo(path: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    subprocess.run(["git", "init", "--quiet", str(path)], check=True)
    (path / "setup.py").write_text("")
    subprocess.run(["git", "-C", str(path), "add", "setup.py"], check=True)
    subprocess.run(["git", "-C", str(path), "commit", "--quiet", "-m", "x"], check=True, env=env)
    out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return out.stdout.strip()


def test_fetch_checks_out_the_pinned_commit_from_a_local_repository(tmp_path):
    # What `make image` does with --detectron2-src: the repository is a path in the build.
    commit = _repo(tmp_path / "origin")
    d2.fetch_source(str(tmp_path / "origin"), commit, tmp_path / "src")
    assert (tmp_path / "src" / "setup.py").exists()


def test_a_commit_the_repository_lacks_fails(tmp_path):
    _repo(tmp_path / "origin")
    with pytest.raises(subprocess.CalledProcessError):
        d2.fetch_source(str(tmp_path / "origin"), "0" * 40, tmp_path / "src")


def test_no_nvcc_and_no_wheels_for_torchs_cuda_names_both(tmp_path, monkeypatch):
    monkeypatch.setattr(d2, "torch_cuda", lambda: "12.6")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    pins = {"nvcc_wheels": {"13.0": ["nvidia-cuda-nvcc==13.0.88"]}}
    with pytest.raises(d2.InstallError, match=r"CUDA 12\.6.*no nvcc for 12\.6 \(only for 13\.0\)"):
        d2.cuda_env(pins, tmp_path, "8.0")


def test_a_cpu_torch_cannot_compile_cuda_ops(tmp_path, monkeypatch):
    monkeypatch.setattr(d2, "torch_cuda", lambda: None)
    with pytest.raises(d2.InstallError, match="torch is a CPU build"):
        d2.cuda_env({}, tmp_path, "8.0")


def test_an_existing_nvcc_is_used_as_is(tmp_path, monkeypatch):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    monkeypatch.setattr(d2, "torch_cuda", lambda: "13.0")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(d2, "cuda_home_from_wheels", lambda *a: pytest.fail("installed wheels"))
    env = d2.cuda_env({}, tmp_path / "work", "8.0;9.0+PTX")
    assert env["FORCE_CUDA"] == "1" and env["CUDA_HOME"] == str(tmp_path)
    assert env["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0+PTX"
    assert env["PATH"].startswith(f"{tmp_path}/bin:")
    # A toolkit has its own cuBLAS/cuSPARSE headers: no second copy from torch's wheels.
    assert "CPATH" not in env


def test_nvcc_from_wheels_adds_torchs_library_headers(tmp_path, monkeypatch):
    monkeypatch.setattr(d2, "torch_cuda", lambda: "13.0")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "none"))
    home = tmp_path / "work" / "cuda" / "nvidia" / "cu13"
    monkeypatch.setattr(d2, "cuda_home_from_wheels", lambda wheels, target: home)
    site = tmp_path / "site"
    (site / "nvidia" / "cu13" / "include").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "include" / "cusparse.h").write_text("")
    monkeypatch.setattr(d2, "site_packages", lambda: site)
    monkeypatch.delenv("CPATH", raising=False)
    env = d2.cuda_env({"nvcc_wheels": {"13.0": ["w"]}}, tmp_path / "work", "9.0")
    assert env["CUDA_HOME"] == str(home)
    assert env["CPATH"] == str(site / "nvidia" / "cu13" / "include")


def test_the_wheel_install_is_skipped_when_already_there(tmp_path, monkeypatch):
    (tmp_path / "detectron2").mkdir()
    (tmp_path / "detectron2" / d2.MARKER).write_text("sal-detectron2==0.7.2\n")
    monkeypatch.setattr(d2.subprocess, "run", lambda *a, **k: pytest.fail("downloaded"))
    assert d2.install_from_wheel("sal-detectron2==0.7.2", tmp_path) == tmp_path / "detectron2"


def test_the_dev_venv_holds_the_pinned_wheels_python_code():
    # make setup installs it the same way (scripts/install_detectron2_cpu.py): marker, no _C.
    target = d2.site_packages() / "detectron2"
    pin = d2.load_pins(PYPROJECT)["detectron2_cpu_wheel"]
    assert (target / d2.MARKER).read_text().strip() == pin
    assert not list(target.glob("_C*.so"))


def _fatbin(entries: list[tuple[int, int]]) -> bytes:
    """A fat binary as nvcc lays it out: (kind 1 PTX / 2 cubin, arch) entries, 8-byte payloads."""
    body = b""
    for kind, arch in entries:
        header = struct.pack("<HHIQ", kind, 0x101, 64, 8) + b"\0" * 12
        header += struct.pack("<I", arch) + b"\0" * (64 - 32)
        body += header + b"payload!"
    return struct.pack("<IHHQ", d2.FATBIN_MAGIC, 1, 16, len(body)) + body


def test_fatbin_archs_reads_cubins_and_ptx_from_every_fat_binary():
    lib = b"\x7fELF junk" + _fatbin([(2, 75), (2, 80)]) + b"more" + _fatbin([(2, 90), (1, 90)])
    assert d2.fatbin_archs(lib) == {"sm_75", "sm_80", "sm_90", "compute_90"}
    assert d2.fatbin_archs(b"no gpu code here") == set()


def test_a_library_missing_a_declared_arch_fails_naming_it(tmp_path):
    lib = tmp_path / "_C.so"
    lib.write_bytes(_fatbin([(2, 80), (2, 90), (1, 90)]))
    assert d2.check_archs(lib, "8.0;9.0+PTX") == {"sm_80", "sm_90", "compute_90"}
    with pytest.raises(d2.InstallError, match=r"no code for compute_120, sm_120, sm_75"):
        d2.check_archs(lib, "7.5;8.0;12.0+PTX")


def test_expected_archs():
    assert d2.expected_archs("7.5;10.0;12.0+PTX") == {"sm_75", "sm_100", "sm_120", "compute_120"}
    assert d2.expected_archs("") == set()
