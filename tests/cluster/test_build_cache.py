"""The control plane's Go builds use a build cache of their own process, deleted when it ends
(the binaries are kept; the compiled packages behind them were 9.2 GB after a full build)."""

from __future__ import annotations

import os
import subprocess
import sys

from megdet.cluster import build


def test_a_build_process_has_its_own_go_cache_and_it_is_gone_when_it_ends(tmp_path):
    stale = tmp_path / "go-build" / "999999999"  # a pid no process has: a killed build's
    stale.mkdir(parents=True)
    (stale / "entry").write_text("compiled")
    env = {k: v for k, v in os.environ.items() if k != "GOCACHE"}
    env["MEGDET_CLUSTER_CACHE"] = str(tmp_path)
    code = (
        "import os\n"
        "from megdet.cluster import build\n"
        "env = build.go_env()\n"
        "assert env['GOCACHE'].endswith(f'/go-build/{os.getpid()}'), env['GOCACHE']\n"
        "assert os.path.isdir(env['GOCACHE'])\n"
        "print(env['GOCACHE'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    used = out.stdout.strip()
    assert used.startswith(str(tmp_path / "go-build"))
    assert not os.path.exists(used)  # removed at exit
    assert not stale.exists()  # and the dead process's too


def test_a_users_gocache_is_theirs(monkeypatch, tmp_path):
    monkeypatch.setenv("GOCACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("MEGDET_CLUSTER_CACHE", str(tmp_path / "cluster"))
    assert build.go_env()["GOCACHE"] == str(tmp_path / "mine")
    assert not (tmp_path / "cluster" / "go-build").exists()
