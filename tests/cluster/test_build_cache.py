"""The control plane's Go builds use a build cache and a module cache of their own process,
deleted when it ends (the binaries are kept; the compiled packages behind them were 9.2 GB
after a full build, the dependencies' sources 3.7 GB)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cluster import build


def _own_cache_is_gone(tmp_path, kind: str, stale_file: str, unset: tuple[str, ...], code: str):
    """Run ``code`` (after ``from cluster import build``) in a new Python process with the
    cluster cache in ``tmp_path`` and the variables ``unset`` removed; it prints the cache
    folder of kind ``kind`` it was given. That folder is gone once the process has ended, and
    so is a stale one (``stale_file`` in the folder of a pid no process has: a killed build's)."""
    stale = tmp_path / kind / "999999999"
    (stale / stale_file).parent.mkdir(parents=True)
    (stale / stale_file).write_text("left by a killed build")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["MEGDET_CLUSTER_CACHE"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", "import os, pathlib\nfrom cluster import build\n" + code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    used = out.stdout.strip()
    assert used.startswith(str(tmp_path / kind))
    assert not os.path.exists(used)  # removed at exit
    assert not stale.exists()  # and the dead process's too


def test_a_build_process_has_its_own_go_cache_and_it_is_gone_when_it_ends(tmp_path):
    code = (
        "env = build.go_env()\n"
        "assert env['GOCACHE'].endswith(f'/go-build/{os.getpid()}'), env['GOCACHE']\n"
        "assert os.path.isdir(env['GOCACHE'])\n"
        "print(env['GOCACHE'])\n"
    )
    _own_cache_is_gone(tmp_path, "go-build", "entry", ("GOCACHE",), code)


def test_a_build_process_has_its_own_go_module_cache_and_it_is_gone_when_it_ends(tmp_path):
    # Other Go commands (module_source) keep Go's default cache. -modcacherw: Go would write
    # the sources read-only, which a non-root user could not remove.
    code = (
        "env = build.go_env(build=True)\n"
        "mods = pathlib.Path(env['GOMODCACHE'])\n"
        "assert mods.name == str(os.getpid()) and mods.parent.name == 'go-mod', mods\n"
        "assert '-modcacherw' in env['GOFLAGS'].split(), env['GOFLAGS']\n"
        "assert 'GOMODCACHE' not in build.go_env()\n"
        "src = mods / 'example.com' / 'n@v1.0.0'\n"
        "src.mkdir(parents=True)\n"
        "(src / 'a.go').write_text('package n')\n"
        "print(mods)\n"
    )
    stale_file = "example.com/m@v1.0.0/go.mod"
    _own_cache_is_gone(tmp_path, "go-mod", stale_file, ("GOMODCACHE", "GOFLAGS"), code)


@pytest.mark.parametrize(
    ("variable", "kind", "for_build"),
    [("GOCACHE", "go-build", False), ("GOMODCACHE", "go-mod", True)],
)
def test_a_users_go_cache_is_theirs(monkeypatch, tmp_path, variable, kind, for_build):
    monkeypatch.setenv(variable, str(tmp_path / "mine"))
    monkeypatch.setenv("MEGDET_CLUSTER_CACHE", str(tmp_path / "cluster"))
    assert build.go_env(build=for_build)[variable] == str(tmp_path / "mine")
    assert not (tmp_path / "cluster" / kind).exists()
