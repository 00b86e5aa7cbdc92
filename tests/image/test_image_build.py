"""`make image` for real: build the controller image from package registries (cached by its
inputs' digest) and run its entrypoint with podman and runc.

A cold build (the Debian base from mmdebstrap, then the image) took 3.5-4 min on the shared
2-core machine, a rebuild after a code change about 1 min, and with the archive cached this
test takes seconds. The training image's cold build (about 14 min) does not fit a test
(docs/benchmarks.md, "make image"): the e2e step builds it (megdet.image.build's ``train-ci``).
"""

from __future__ import annotations

import pytest

from megdet.image import build as b

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def controller_archive():
    return b.build("controller")


def test_the_archive_says_who_runs_what(controller_archive):
    info = b.describe(controller_archive)
    assert info["ref"] == b.tag_for(b.VARIANTS["controller"], b.pyproject()["project"]["version"])
    assert info["digest"].startswith("sha256:")
    assert info["user"] == "10001:10001"
    assert info["entrypoint"] == ["megdet"] and info["cmd"] == ["controller"]
    assert controller_archive.parent == b.ROOT / "output" / "images"


def test_doctor_runs_in_the_controller_image(controller_archive):
    result = b.run_in_image(controller_archive, ["doctor"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("megdet doctor")
    assert "torch: not installed (this image cannot train)" in result.stdout
    assert "uid 10001" in result.stdout  # the image's user, not root
    assert "Traceback" not in result.stderr


def test_the_controller_command_is_there(controller_archive):
    result = b.run_in_image(controller_archive, ["controller", "--help"])
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
