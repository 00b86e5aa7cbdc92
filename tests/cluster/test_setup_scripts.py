"""The machine-wide set-up around the cluster: the Go builds check every module against Go's
checksum database, Debian's containerd.service that installing containerd enables is
disabled again, and Prometheus's package is downloaded into a folder only its user opens."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import build

ROOT = Path(__file__).resolve().parents[2]


# --- the Go builds -------------------------------------------------------------------------------
def test_the_go_builds_check_the_checksum_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOSUMDB", raising=False)
    monkeypatch.setenv("GONOSUMDB", "k8s.io")
    monkeypatch.setenv("GOPRIVATE", "sigs.k8s.io")
    env = build.go_env()
    assert env["GOSUMDB"] == "sum.golang.org"
    assert env["GONOSUMDB"] == build.NO_SUMDB_EXEMPTIONS  # not the user's k8s.io / sigs.k8s.io
    monkeypatch.setenv(
        "GOSUMDB",
        "sum.golang.org+033de0ae+Ac4zctda0e5eza+HJyk9SxEdh+s3Ux18htTTAD8OuAn8 https://sum.example",
    )
    assert build.go_env()["GOSUMDB"].endswith("https://sum.example")  # a mirror of the user's
    monkeypatch.setenv("GOSUMDB", "off")
    with pytest.raises(build.BuildError, match=r"GOSUMDB=off: .*unset GOSUMDB"):
        build.go_env()


# --- Debian's containerd.service -----------------------------------------------------------------
def run_package_script(tmp_path: Path, installed: set[str]) -> tuple[int, list[str], str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir(parents=True)
    log = tmp_path / "calls.log"
    status = " ".join(sorted(installed))
    scripts = {
        # dpkg-query -W -f=... PKG: "install ok installed" for the packages in `installed`.
        "dpkg-query": f'for p in {status}; do [ "${{@: -1}}" = "$p" ] && '
        'echo "install ok installed" && exit 0; done; exit 1',
        "id": "echo 0",
        "apt-get": f'echo "apt-get $*" >> {log}',
        "systemctl": f'echo "systemctl $*" >> {log}',
    }
    for name, body in scripts.items():
        (stubs / name).write_text(f"#!/bin/bash\n{body}\n")
        (stubs / name).chmod(0o755)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/install_node_packages.sh")],
        env={"PATH": f"{stubs}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return proc.returncode, calls, proc.stdout + proc.stderr


def test_the_containerd_service_debian_enables_is_disabled_when_the_script_installs_it(
    tmp_path: Path,
) -> None:
    others = {"runc", "containernetworking-plugins", "iptables", "busybox-static", "gcc"}
    others |= {"libc6-dev", "libjemalloc2"}
    rc, calls, out = run_package_script(tmp_path / "a", others)
    assert rc == 0, out
    assert any(c.startswith("apt-get") and " install " in c and "containerd" in c for c in calls)
    assert calls[-1].startswith("systemctl disable") and "containerd.service" in calls[-1]
    # A containerd the user had already is theirs: left as it is.
    rc, calls, out = run_package_script(tmp_path / "b", others - {"gcc"} | {"containerd"})
    assert rc == 0, out
    assert not [c for c in calls if c.startswith("systemctl")]


# --- install_prometheus.py ------------------------------------------------------------------------
def load_install_prometheus():
    spec = importlib.util.spec_from_file_location(
        "install_prometheus", ROOT / "scripts" / "install_prometheus.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prometheus_downloads_into_a_folder_only_its_user_opens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = load_install_prometheus()
    seen: dict[str, object] = {}

    def fake_download(workdir: Path) -> Path:
        info = workdir.stat()
        seen.update(mode=stat.S_IMODE(info.st_mode), uid=info.st_uid)
        raise script.InstallError("stop before dpkg-deb")

    monkeypatch.setattr(script, "target_dir", lambda: tmp_path / "prom")
    monkeypatch.setattr(script, "_require_tools", lambda: None)
    monkeypatch.setattr(script, "download", fake_download)
    assert script.main() == 1
    assert seen == {"mode": 0o700, "uid": os.getuid()}


# --- the host builders start before the .venv ----------------------------------------------------
@pytest.mark.parametrize("module", ["cluster.build", "imagebuild.build"])
def test_the_host_builders_run_on_the_bare_interpreter(module: str) -> None:
    # `make suite-deps` runs them with $(PYTHON), beside the .venv install, not after it: an
    # import from outside the standard library would break the first `make test` on a fresh
    # machine. -I -S: no site-packages, no user site, no current folder on the path.
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import {module}"
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    makefile = (ROOT / "Makefile").read_text()
    assert f"$(PYTHON) -m {module}" in makefile


# --- what `make suite-deps` runs at once -----------------------------------------------------
def _make_database() -> tuple[dict[str, list[str]], dict[str, str]]:
    """Each target's prerequisites and recipe, as GNU make reads them (its database: -p -n -q)."""
    done = subprocess.run(
        ["make", "-pnq", "-f", str(ROOT / "Makefile"), "help"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    prereqs: dict[str, list[str]] = {}
    recipes: dict[str, str] = {}
    target = None
    for line in done.stdout.splitlines():
        if line.startswith("\t") and target:
            recipes[target] = recipes.get(target, "") + line.strip() + "\n"
        elif ":" in line and not line.startswith(("#", " ", "\t")) and "=" not in line:
            target, _, deps = line.partition(":")
            prereqs.setdefault(target, deps.split())
        elif not line.strip():
            target = None
    return prereqs, recipes


def _closure(prereqs: dict[str, list[str]], targets: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(targets)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += prereqs.get(name, [])
    return seen


def test_suite_deps_starts_the_go_builds_before_the_debian_packages() -> None:
    # On a fresh machine the Go builds are the longest step; the Debian packages (apt-get)
    # come before the images only (the image builder's own apt-get would fail on apt's lock).
    prereqs, recipes = _make_database()
    assert prereqs["suite-deps"] == [], prereqs["suite-deps"]
    recipe = recipes["suite-deps"].replace("\\\n", " ")  # continued lines joined
    (call,) = [line for line in recipe.splitlines() if "-j" in line]
    together = [word for word in call.split() if not word.startswith(("-", "$", "make"))]
    assert {"setup", "suite-cluster", "packages-then-images", "lint-tools"} <= set(together)
    for name in ("setup", "suite-cluster", "lint-tools"):
        assert "node-packages" not in _closure(prereqs, [name]), name
    assert "node-packages" in prereqs["packages-then-images"]
    assert "suite-images" in recipes["packages-then-images"]
    assert "suite-deps" in prereqs["test"] and "suite-deps" in prereqs["test-real-pods"]


# --- the .venv that `make setup` installs ---------------------------------------------------------
def test_the_venvs_packages_carry_their_bytecode_from_the_install() -> None:
    """`make setup` compiles the installed packages' bytecode, as pip did: uv writes none by
    default, and where PYTHONDONTWRITEBYTECODE is set every process then compiled sympy and
    torch._dynamo again (6 s more per detectron2 import; docs/benchmarks.md). sympy stands for
    them: the suite imports a few of its modules, so only an install compiles all of them."""
    import importlib.util as iu

    import sympy

    sources = sorted(Path(sympy.__file__).parent.rglob("*.py"))
    assert len(sources) > 500
    missing = [p for p in sources if not Path(iu.cache_from_source(str(p))).is_file()]
    assert not missing, (
        f"{len(missing)} of sympy's {len(sources)} modules have no .pyc: {missing[:3]}"
    )
