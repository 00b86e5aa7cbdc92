"""`make image` for real: build the controller image from package registries (cached by its
inputs' digest) and run its entrypoint with podman and runc.

A cold build (the Debian base from mmdebstrap, then the image) took 3.5-4 min on the shared
2-core machine, a rebuild after a code change about 1 min, and with the archive cached this
test takes seconds. The training image's cold build (about 14 min) does not fit a test
(docs/benchmarks.md, "make image"): the e2e step builds it (imagebuild.build's ``train-ci``).
"""

from __future__ import annotations

import json

import pytest

from imagebuild import build as b

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


def test_megdet_validate_runs_offline_in_the_controller_image(controller_archive):
    """`megdet validate` needs the controller extra's packages alone (jsonschema was once only
    in [dev]: a traceback in the image)."""
    run = (
        "apiVersion: megdet.io/v1alpha1\nkind: MegDetRun\nmetadata: {name: a}\n"
        "spec: {gpus: 12, dataset: {claimName: coco}}\n"
    )
    result = b.run_in_image(
        controller_archive,
        ["-c", f"printf '%s' '{run}' > /tmp/run.yaml && megdet validate -f /tmp/run.yaml"],
        entrypoint="/bin/sh",
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode != 0  # 12 GPUs: not a whole number of 8-GPU nodes
    assert "spec.gpus" in result.stdout + result.stderr, result.stdout + result.stderr


def test_the_controller_image_allocates_with_jemalloc_and_the_trimmer_purges_it(
    controller_archive,
):
    """The image preloads jemalloc for every allocation (Dockerfile ENV): the library is there,
    the loader takes it, and the heap trimmer finds jemalloc's purge, which gives a freed burst
    back (glibc's malloc_trim would not: it has no arena of jemalloc's)."""
    code = (
        "import json, os; from megdet.controller.heap import HeapTrimmer, rss_bytes; "
        "t = HeapTrimmer(); b = [bytearray(3000) for _ in range(40000)]; del b; "
        "before = rss_bytes(); t._trim(); "
        "maps = open('/proc/self/maps').read(); "
        "print(json.dumps({'allocator': t.allocator, 'mapped': 'libjemalloc' in maps, "
        "'env': [os.environ.get('LD_PRELOAD'), os.environ.get('PYTHONMALLOC')], "
        "'released': before - rss_bytes()}))"
    )
    result = b.run_in_image(controller_archive, ["-c", code], entrypoint="python")
    assert result.returncode == 0, result.stderr
    assert "cannot be preloaded" not in result.stderr, result.stderr
    report = json.loads(result.stdout)
    assert report["env"] == ["libjemalloc.so.2", "malloc"]
    assert report["mapped"] and report["allocator"] == "jemalloc"
    assert report["released"] > 60 * 2**20, report


def test_the_controller_image_keeps_no_package_lists_or_caches(controller_archive):
    """apt's lists and its binary caches of them (pkgcache.bin, srcpkgcache.bin: 77 MB in the
    Debian base made here) are not shipped."""
    result = b.run_in_image(
        controller_archive,
        ["-c", "ls /var/lib/apt/lists /var/cache/apt"],
        entrypoint="/bin/sh",
    )
    assert result.returncode == 0, result.stderr
    assert ".bin" not in result.stdout and "_Packages" not in result.stdout, result.stdout


def test_the_charts_pymalloc_setting_turns_jemalloc_off_in_the_image(controller_archive):
    """controller.allocator=pymalloc sets LD_PRELOAD empty and PYTHONMALLOC=pymalloc over the
    image's ENV: the process then runs on glibc's malloc, and the trimmer trims glibc's."""
    code = (
        "import json; from megdet.controller.heap import HeapTrimmer; "
        "print(json.dumps({'allocator': HeapTrimmer().allocator, "
        "'mapped': 'libjemalloc' in open('/proc/self/maps').read()}))"
    )
    result = b.run_in_image(
        controller_archive,
        ["-c", f'LD_PRELOAD= PYTHONMALLOC=pymalloc MALLOC_ARENA_MAX=2 python -c "{code}"'],
        entrypoint="/bin/sh",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"allocator": "glibc", "mapped": False}
