"""Unpack Debian's ``prometheus`` package (server + promtool) into this virtual environment.

The monitoring tests run every dashboard query and alert rule against a real Prometheus and
check the rules with ``promtool``. Debian ships both in one package. Installing it would need
root and would start a system service, so we download the .deb with ``apt-get download`` (no
root needed) and unpack it with ``dpkg-deb -x`` into ``<venv>/prometheus``; the binaries land
in ``<venv>/prometheus/usr/bin``. On a fresh machine apt's package lists may be empty: as root
(CI) we run ``apt-get update`` once and retry; otherwise we say what to run.

The upstream version is pinned in pyproject.toml (``[tool.megdet] prometheus_version``); the
Debian revision is not, because security updates replace it on the mirror.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "prometheus"


class InstallError(RuntimeError):
    """A step failed; the message says what to do."""


def target_dir() -> Path:
    """Where the package is unpacked: ``<venv>/prometheus`` (sys.prefix is the venv)."""
    return Path(sys.prefix) / "prometheus"


def pinned_version() -> str:
    """The upstream Prometheus version pyproject.toml pins (e.g. ``2.42.0``)."""
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["megdet"]
    return str(pins["prometheus_version"])


def installed_version(root: Path) -> str | None:
    """The upstream version of the unpacked ``prometheus`` binary, or None when absent/broken."""
    binary = root / "usr" / "bin" / "prometheus"
    if not binary.exists():
        return None
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    # "prometheus, version 2.42.0+ds (branch: ...": the upstream part is before "+".
    words = (out.stdout + out.stderr).split()
    if len(words) < 3 or words[1] != "version":
        return None
    return words[2].split("+")[0]


def _require_tools() -> None:
    missing = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
    if missing:
        raise InstallError(
            f"{', '.join(missing)} not found: the monitoring tests need Debian's 'prometheus' "
            "package (Debian/Ubuntu). On another OS install Prometheus "
            f"{pinned_version()} and promtool and point MEGDET_PROMETHEUS_BIN at their folder."
        )


def _apt_download(workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["apt-get", "download", PACKAGE],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )


def download(workdir: Path) -> Path:
    """Download the .deb into workdir; refresh apt's lists once if root and the first try fails."""
    result = _apt_download(workdir)
    if result.returncode != 0 and os.geteuid() == 0:
        print("apt-get download failed; running apt-get update once and retrying", flush=True)
        update = subprocess.run(["apt-get", "update"], capture_output=True, text=True, check=False)
        if update.returncode != 0:
            raise InstallError(f"apt-get update failed:\n{update.stderr.strip()}")
        result = _apt_download(workdir)
    if result.returncode != 0:
        hint = (
            ""
            if os.geteuid() == 0
            else " Apt's package lists may be empty: run "
            "'sudo apt-get update' once, then 'make test' again."
        )
        raise InstallError(f"apt-get download {PACKAGE} failed: {result.stderr.strip()}.{hint}")
    debs = sorted(workdir.glob(f"{PACKAGE}_*.deb"))
    if not debs:
        raise InstallError(f"apt-get download {PACKAGE} reported success but left no .deb")
    return debs[-1]


def main() -> int:
    want = pinned_version()
    target = target_dir()
    if installed_version(target) == want:
        print(f"prometheus {want} already unpacked in {target}")
        return 0
    try:
        _require_tools()
        # A folder only this user can open (mkdtemp's 0700): nobody else can put a .deb in it
        # for dpkg-deb to unpack. As root, apt then downloads without its _apt sandbox and
        # says so in a notice; nothing else changes.
        with tempfile.TemporaryDirectory(prefix="megdet-prometheus-") as tmp:
            deb = download(Path(tmp))
            shutil.rmtree(target, ignore_errors=True)
            subprocess.run(["dpkg-deb", "-x", deb, target], check=True)
        got = installed_version(target)
        if got != want:
            raise InstallError(
                f"apt's {PACKAGE} is version {got}, pyproject.toml pins prometheus_version="
                f"{want}: update the pin after checking the monitoring tests pass with {got}."
            )
    except InstallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"unpacked prometheus {want} and promtool into {target}/usr/bin")
    return 0


if __name__ == "__main__":
    sys.exit(main())
