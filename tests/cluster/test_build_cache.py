"""The control plane's Go builds use a build cache and a module cache of their own process,
deleted when it ends (the binaries are kept; the compiled packages behind them were 9.2 GB
after a full build, the dependencies' sources 3.7 GB)."""

from __future__ import annotations

import os
import subprocess
import sys

from cluster import build


def _cache_of_a_child(tmp_path, unset: tuple[str, ...], code: str) -> str:
    """Run ``code`` in a new Python process with the cluster cache in ``tmp_path`` and the
    variables ``unset`` removed; return the cache folder it printed (the process has ended)."""
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["MEGDET_CLUSTER_CACHE"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_build_process_has_its_own_go_cache_and_it_is_gone_when_it_ends(tmp_path):
    stale = tmp_path / "go-build" / "999999999"  # a pid no process has: a killed build's
    stale.mkdir(parents=True)
    (stale / "entry").write_text("compiled")
    code = (
        "import os\n"
        "from cluster import build\n"
        "env = build.go_env()\n"
        "assert env['GOCACHE'].endswith(f'/go-build/{os.getpid()}'), env['GOCACHE']\n"
        "assert os.path.isdir(env['GOCACHE'])\n"
        "print(env['GOCACHE'])\n"
    )
    used = _cache_of_a_child(tmp_path, ("GOCACHE",), code)
    assert used.startswith(str(tmp_path / "go-build"))
    assert not os.path.exists(used)  # removed at exit
    assert not stale.exists()  # and the dead process's too


def test_a_users_gocache_is_theirs(monkeypatch, tmp_path):
    monkeypatch.setenv("GOCACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("MEGDET_CLUSTER_CACHE", str(tmp_path / "cluster"))
    assert build.go_env()["GOCACHE"] == str(tmp_path / "mine")
    assert not (tmp_path / "cluster" / "go-build").exists()


def test_a_build_process_has_its_own_go_module_cache_and_it_is_gone_when_it_ends(tmp_path):
    # Other Go commands (module_source) keep Go's default cache. -modcacherw: Go would write
    # the sources read-only, which a non-root user could not remove.
    stale = tmp_path / "go-mod" / "999999999" / "example.com" / "m@v1.0.0"
    stale.mkdir(parents=True)
    (stale / "go.mod").write_text("module example.com/m\n")
    code = (
        "import os, pathlib\n"
        "from cluster import build\n"
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
    used = _cache_of_a_child(tmp_path, ("GOMODCACHE", "GOFLAGS"), code)
    assert used.startswith(str(tmp_path / "go-mod"))
    assert not os.path.exists(used)  # removed at exit
    assert not (tmp_path / "go-mod" / "999999999").exists()  # and the dead process's too


def test_a_users_gomodcache_is_theirs(monkeypatch, tmp_path):
    monkeypatch.setenv("GOMODCACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("MEGDET_CLUSTER_CACHE", str(tmp_path / "cluster"))
    assert build.go_env(build=True)["GOMODCACHE"] == str(tmp_path / "mine")
    assert not (tmp_path / "cluster" / "go-mod").exists()
