"""The build store stays bounded: a variant rebuilt with new inputs leaves its previous image's
layers behind, which ``prune_store`` removes, while the current images, the training variants'
build stages (``keep_stage``) and the layers under them stay as the next build's cache, the
training image's copy of the build stage's venv among them: a code change's rebuild takes that
copy from the cache instead of making it again.

Real podman on a store of its own (a temporary ``MEGDET_IMAGE_CACHE``), with a base imported
from a tar of one file: COPY steps only, so nothing runs in a container. (A CI run once failed
with "No space left on device": each change to the training image's inputs had left its
previous 6 GB chain in the store.)
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile

import pytest

from imagebuild import build as b

pytestmark = pytest.mark.slow

CONTAINERFILE = """\
FROM localhost/store-test-base:1 AS build
COPY torch.txt /torch.txt
COPY code.txt /code.txt
FROM localhost/store-test-base:1 AS train
COPY --from=build /torch.txt /opt/torch.txt
COPY --from=build /code.txt /opt/code.txt
"""


@pytest.fixture
def store(tmp_path, monkeypatch):
    b.ensure_tools()
    cache = tmp_path / "cache"
    monkeypatch.setenv("MEGDET_IMAGE_CACHE", str(cache))
    env = b.engine_env(cache)
    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        data = b"base\n"
        info = tarfile.TarInfo("etc/base")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    subprocess.run(
        ["podman", "import", str(rootfs), "localhost/store-test-base:1"],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    context = tmp_path / "context"
    context.mkdir()
    (context / "Containerfile").write_text(CONTAINERFILE)
    (context / "torch.txt").write_text("the big layer\n")
    yield env, context
    # Not `podman system reset`: it also removes the engine's tmp_dir, /run/libpod, which every
    # store on the machine shares, under any podman running beside this test (a CI run's
    # `podman image inspect` failed with "open /run/libpod/alive: no such file or directory").
    subprocess.run(["podman", "rmi", "--all", "--force"], env=env, capture_output=True)
    shutil.rmtree(cache, ignore_errors=True)


def images(env) -> dict[str, list[str]]:
    """Every image in the store (intermediates included): id -> its names."""
    out = subprocess.run(
        ["podman", "images", "--all", "--no-trunc", "--format", "{{.ID}} {{.Names}}"],
        env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    found = {}
    for line in out.stdout.splitlines():
        image_id, _, names = line.partition(" ")
        found[image_id.removeprefix("sha256:")] = names.strip("[]").split()
    return found


def build_train(env, context, code: str) -> tuple[list[str], str]:
    (context / "code.txt").write_text(code)
    iid = context.parent / "iid"
    cmd = ["podman", "build", *b.ENGINE_FLAGS, "--target", "train", "--tag",
           "localhost/store-test:1", "--iidfile", str(iid), "--file",
           str(context / "Containerfile"), str(context)]  # fmt: skip
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return cmd, iid.read_text().strip().removeprefix("sha256:")


def test_a_rebuild_leaves_only_the_current_images_and_their_cache(store):
    env, context = store
    variant = b.VARIANTS["train-ci"]
    cmd, first = build_train(env, context, "v1\n")
    b.keep_stage(variant, cmd, env)
    assert b.prune_store(env) == 0  # nothing stale after the first build
    after_first = images(env)
    stage_first = next(i for i, names in after_first.items() if b.stage_tag(variant) in names)

    # The code changes: a new train image and a new build stage; the torch layer is shared.
    cmd, second = build_train(env, context, "v2\n")
    b.keep_stage(variant, cmd, env)
    before_prune = images(env)
    assert first in before_prune and stage_first in before_prune  # both now untagged
    removed = b.prune_store(env)
    left = images(env)
    assert removed == 2  # the old train image and the old stage (its code.txt step)
    assert first not in left and stage_first not in left
    assert "localhost/store-test:1" in left[second]
    stage_second = next(i for i, names in left.items() if b.stage_tag(variant) in names)
    assert stage_second != stage_first
    # What stays is this build's chain, and the next build of the same inputs is all cache.
    assert b.prune_store(env) == 0
    cmd, again = build_train(env, context, "v2\n")
    assert again == second
    assert images(env) == left


def test_a_code_change_takes_the_training_images_venv_copy_from_the_store(store):
    # The real train stage copies the build stage's 6 GB venv (here torch.txt), then the code:
    # after a code change and the store's pruning, the copy of the venv is the same image as
    # before (a cache hit), and only the build stage's and the train stage's code steps are new.
    env, context = store
    variant = b.VARIANTS["train-ci"]
    cmd, first = build_train(env, context, "v1\n")
    b.settle_store(variant, cmd, env)  # what a build does once its archive is saved
    before = images(env)
    venv_copy = parent(env, first)  # the train stage's COPY of torch.txt
    assert venv_copy in before
    cmd, second = build_train(env, context, "v2\n")
    b.settle_store(variant, cmd, env)
    after = images(env)
    assert parent(env, second) == venv_copy
    new = set(after) - set(before)
    assert new == {second, next(i for i, n in after.items() if b.stage_tag(variant) in n)}


def parent(env, image_id: str) -> str:
    out = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Parent}}", image_id],
        env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return out.stdout.strip().removeprefix("sha256:")


def test_an_interrupted_engines_temporary_files_are_removed_and_a_running_ones_kept(tmp_path):
    import os
    import time

    tmp = tmp_path / "tmp"
    old_file = tmp / "4079994295"
    old_dir = tmp / "oci1481966133"
    busy_dir = tmp / "oci2"  # old itself, but a file in it is being written
    fresh = tmp / "123"
    for d in (old_dir / "blobs", busy_dir / "blobs"):
        d.mkdir(parents=True)
    old_file.write_bytes(b"x" * 1000)
    (old_dir / "blobs" / "a").write_bytes(b"y" * 500)
    (busy_dir / "blobs" / "b").write_bytes(b"z")
    fresh.write_bytes(b"w")
    hours_ago = time.time() - 2 * 3600
    for path in (old_file, old_dir, old_dir / "blobs", old_dir / "blobs" / "a", busy_dir,
                 busy_dir / "blobs"):  # fmt: skip
        os.utime(path, (hours_ago, hours_ago))
    said = b.clear_stale_tmp(tmp)
    assert sorted(p.name for p in tmp.iterdir()) == ["123", "oci2"]
    assert said == "2 entries (0.0 GB)"
    assert b.clear_stale_tmp(tmp) == ""
    assert b.clear_stale_tmp(tmp_path / "absent") == ""


def test_a_build_waits_for_the_one_that_holds_the_lock(tmp_path):
    # The pruning would remove a running build's newest (untagged, childless) step: builds
    # sharing a cache take turns.
    import fcntl

    with (
        b.build_lock(tmp_path),
        open(tmp_path / "build.lock") as other,
        pytest.raises(BlockingIOError),
    ):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(tmp_path / "build.lock") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again


def test_an_interrupted_builds_containers_go_and_the_store_prunes_again(store):
    # A killed build leaves its buildah working containers behind; an image under one is never
    # pruned (and podman image prune exited 125 on them once, failing the next build after its
    # archive was saved), so the store grew by every interrupted build's chain.
    env, context = store
    variant = b.VARIANTS["train-ci"]
    cmd, first = build_train(env, context, "v1\n")
    b.keep_stage(variant, cmd, env)
    subprocess.run(["buildah", "from", first], env=env, check=True, capture_output=True)
    cmd, _ = build_train(env, context, "v2\n")
    b.keep_stage(variant, cmd, env)
    b.prune_store(env)
    assert first in images(env)  # held by the left-over container
    assert b.clear_stale_containers(env) == 1
    assert b.prune_store(env) >= 1
    assert first not in images(env)
    assert b.clear_stale_containers(env) == 0
