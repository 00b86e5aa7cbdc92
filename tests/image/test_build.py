"""`make image` (imagebuild.build) without an engine: its command lines, args and cache key."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imagebuild import build as b
from imagebuild import recipes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pins() -> dict:
    return b.image_pins(b.pyproject(ROOT))


@pytest.fixture(scope="module")
def data() -> dict:
    return b.pyproject(ROOT)


@pytest.fixture(scope="module")
def defaults() -> dict[str, str]:
    return recipes.global_args(recipes.dockerfile_text(ROOT))


def test_dockerignore_rules():
    patterns = ["tests", "charts", "!charts/megdet", "**/__pycache__", "*.egg-info"]
    assert b.is_ignored("tests/image/test_build.py", patterns)
    assert b.is_ignored("charts/megdet-operator/values.yaml", patterns)
    assert not b.is_ignored("charts/megdet/values.yaml", patterns)
    assert b.is_ignored("image/__pycache__/build.cpython-311.pyc", patterns)
    assert b.is_ignored("megdet.egg-info/PKG-INFO", patterns)
    assert not b.is_ignored("imagebuild/build.py", patterns)


def test_context_is_what_the_dockerfile_needs_and_nothing_else():
    files = b.context_files(ROOT)
    assert "pyproject.toml" in files and "imagebuild/pins.py" in files
    assert "imagebuild/detectron2_install.py" in files
    assert "charts/megdet/Chart.yaml" in files
    assert not [f for f in files if f.startswith(("tests/", ".git/", ".venv/", "output/"))]
    assert not [f for f in files if f.startswith("charts/megdet-operator/")]
    assert "Dockerfile" not in files  # .dockerignore drops it; the digest adds it (below)
    # pyproject.toml's readme: the Dockerfile writes a stub, so a README edit rebuilds nothing.
    assert "README.md" not in files


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("a = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("")
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / ".dockerignore").write_text("tests\n")
    return tmp_path


def test_digest_follows_the_context_the_dockerfile_and_the_args(tmp_path):
    root = _tree(tmp_path)
    key = b.inputs_digest(root, "train", {"A": "1"})
    assert key == b.inputs_digest(root, "train", {"A": "1"})
    (root / "tests" / "t.py").write_text("changed")  # ignored: same key
    assert b.inputs_digest(root, "train", {"A": "1"}) == key
    assert b.inputs_digest(root, "controller", {"A": "1"}) != key
    assert b.inputs_digest(root, "train", {"A": "2"}) != key
    assert b.inputs_digest(root, "train", {"A": "1"}, ["base"]) != key
    (root / "Dockerfile").write_text("FROM y\n")
    changed = b.inputs_digest(root, "train", {"A": "1"})
    assert changed != key
    (root / "pkg" / "a.py").write_text("a = 2\n")
    assert b.inputs_digest(root, "train", {"A": "1"}) != changed


def test_digest_includes_the_dockerfile_although_dockerignore_drops_it():
    # .dockerignore lists the Dockerfile (engines still read it); the key must follow it.
    assert "Dockerfile" in b.dockerignore_patterns(ROOT)
    assert b.is_ignored("Dockerfile", b.dockerignore_patterns(ROOT))


def test_registry_only_args_for_the_training_image(data, defaults):
    # The Dockerfile's defaults, written out, on the local base.
    args = b.build_args(b.VARIANTS["train"], data, "localhost/base:x", None, 2)
    assert args == {
        "BUILD_BASE": "localhost/base:x",
        "RUNTIME_BASE": "localhost/base:x",
        "PYTHON": defaults["PYTHON"],
        "TORCH_INDEX_URL": "https://pypi.org/simple",
        "DETECTRON2_SOURCE": "pypi",
    }
    assert defaults["PYTHON"] == "python3.11"  # Debian 12's
    assert defaults["DETECTRON2_SOURCE"] == "pypi"


def test_a_git_source_compiles_cuda_ops_for_train_and_cpp_only_for_ci(data, defaults):
    commit = "0" * 40
    full = b.build_args(b.VARIANTS["train"], data, "B", commit, 2)
    assert full["DETECTRON2_SOURCE"] == "git"
    assert full["DETECTRON2_REPO"] == b.DETECTRON2_MOUNT
    assert full["DETECTRON2_COMMIT"] == commit
    assert full["TORCH_CUDA_ARCH_LIST"] == defaults["TORCH_CUDA_ARCH_LIST"]
    assert full["MAX_JOBS"] == "2"
    ci = b.build_args(b.VARIANTS["train-ci"], data, "B", commit, 2)
    assert ci["TORCH_CUDA_ARCH_LIST"] == ""


def test_controller_args_only_set_its_base(data):
    assert b.build_args(b.VARIANTS["controller"], data, "B", "0" * 40, 2) == {
        "CONTROLLER_BASE": "B"
    }


def test_a_variant_without_exactly_one_arg_set_is_a_clear_error(data):
    broken = copy.deepcopy(data)
    broken["tool"]["megdet"]["image"]["arg_sets"]["cpp-ops"]["variants"].append("train")
    with pytest.raises(b.BuildError, match="variant 'train' with a detectron2 source needs"):
        b.build_args(b.VARIANTS["train"], broken, "B", "0" * 40, 2)


def test_build_command(tmp_path, pins):
    variant = b.VARIANTS["train"]
    args = {"B": "2", "A": "1"}
    cmd = b.build_command(
        variant, args, "t:1", tmp_path, Path("/src/d2.git"), ROOT, iidfile=tmp_path / "iid"
    )
    assert cmd[:2] == ["podman", "build"]
    assert "--pull=never" in cmd  # nothing from a registry
    assert cmd[cmd.index("--format") + 1] == "docker"  # OCI format would drop SHELL
    assert cmd[cmd.index("--target") + 1] == "train"
    assert cmd[cmd.index("--file") + 1] == str(ROOT / "Dockerfile")
    assert cmd[cmd.index("--iidfile") + 1] == str(tmp_path / "iid")
    assert [cmd[i + 1] for i, c in enumerate(cmd) if c == "--build-arg"] == ["A=1", "B=2"]
    volumes = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--volume"]
    assert volumes == [
        f"{b.CA_BUNDLE}:{b.CA_BUNDLE}:ro",
        f"{tmp_path / 'pip.conf'}:/etc/pip.conf:ro",
        f"/src/d2.git:{b.DETECTRON2_MOUNT}:ro",
    ]
    assert cmd[-1] == str(ROOT)


def test_base_command(pins, tmp_path):
    cmd = b.base_command(pins, tmp_path / "o.tar", Path("/etc/apt/sources.list.d/debian.sources"))
    assert cmd[:2] == ["mmdebstrap", "--variant=minbase"]
    assert "--include=ca-certificates,passwd,python3,python3-venv" in cmd
    assert cmd[-3:] == [
        "bookworm",
        str(tmp_path / "o.tar"),
        "/etc/apt/sources.list.d/debian.sources",
    ]


def test_engine_settings_this_machine_needs():
    conf = b.containers_conf(20000, 32768, Path("/c/tmp"))
    assert 'image_copy_tmp_dir = "/c/tmp"' in conf
    assert 'runtime = "runc"' in conf and 'cgroup_manager = "cgroupfs"' in conf
    assert '"nofile=20000:20000", "nproc=32768:32768"' in conf
    assert b.hard_limit(b.resource.RLIMIT_NPROC, b.NPROC_CAP) <= b.NPROC_CAP


def test_archive_name_carries_the_variant_and_digest(tmp_path):
    path = b.archive_path(tmp_path, b.VARIANTS["train-ci"], "ab" * 32)
    assert path == tmp_path / f"megdet-train-ci-{'ab' * 8}.oci.tar"


def test_tags_are_what_the_charts_default_to():
    version = b.pyproject(ROOT)["project"]["version"]
    assert b.tag_for(b.VARIANTS["train"], version) == f"ghcr.io/megdet/megdet:{version}"
    assert b.tag_for(b.VARIANTS["controller"], version) == (
        f"ghcr.io/megdet/megdet-controller:{version}"
    )
    for chart in ("megdet", "megdet-operator"):
        values = (ROOT / "charts" / chart / "values.yaml").read_text()
        assert (
            f"repository: ghcr.io/megdet/{'megdet' if chart == 'megdet' else 'megdet-controller'}"
            in values
        )


def test_a_cached_archive_is_returned_without_an_engine(tmp_path, monkeypatch):
    # Same inputs, same archive: build() returns it before looking for podman.
    pins = b.image_pins(b.pyproject(ROOT))
    args = b.build_args(b.VARIANTS["controller"], b.pyproject(ROOT), "BASE", None, 1)
    key = b.json.dumps({k: pins[k] for k in ("debian_suite", "base_packages")})
    digest = b.inputs_digest(ROOT, "controller", args, [key, *b.ENGINE_FLAGS])
    archive = b.archive_path(tmp_path, b.VARIANTS["controller"], digest)
    archive.write_bytes(b"")
    monkeypatch.setattr(b, "ensure_tools", lambda: pytest.fail("built again"))
    assert b.build("controller", output=tmp_path) == archive


def test_unknown_variant_is_a_clear_error(capsys):
    assert b.main(["nope"]) == 2
    assert "variant 'nope': not one of controller, train, train-ci" in capsys.readouterr().err


def test_a_source_without_the_pinned_commit_is_refused(tmp_path):
    if not shutil.which("git"):
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "--quiet", "--bare", str(tmp_path)], check=True)
    with pytest.raises(b.BuildError, match="does not hold the pinned commit"):
        b.build("train", detectron2_src=tmp_path, output=tmp_path / "out")


def test_help_runs():
    out = subprocess.run(
        [sys.executable, "-m", "imagebuild.build", "--help"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert "--detectron2-src" in out.stdout


def test_declared_cuda_archs_are_archs_pypis_torch_has_kernels_for(defaults):
    # The default image's detectron2 ops (with DETECTRON2_SOURCE=git) are declared for GPUs its
    # torch runs on: every entry must be one of the archs the pinned PyPI torch was compiled
    # for (no 7.0: CUDA 13).
    torch = pytest.importorskip("torch")
    torch_archs = {f"{a[3:-1]}.{a[-1]}" for a in torch._C._cuda_getArchFlags().split()}
    declared = [a.removesuffix("+PTX") for a in defaults["TORCH_CUDA_ARCH_LIST"].split(";")]
    assert declared and set(declared) <= torch_archs
    assert defaults["TORCH_CUDA_ARCH_LIST"].endswith("+PTX")
    assert torch.version.cuda.split(".")[0] == "13"


def test_older_archives_of_a_variant_are_pruned_and_others_kept(tmp_path):
    names = [
        "megdet-train-" + "a" * 16 + ".oci.tar",  # train, older digest: pruned
        "megdet-train-" + "a" * 16 + ".oci.json",
        "megdet-train-" + "b" * 16 + ".oci.tar",  # the new one: kept
        "megdet-train-" + "b" * 16 + ".oci.json",
        "megdet-train-ci-" + "c" * 16 + ".oci.tar",  # another variant: kept
        "megdet-controller-" + "d" * 16 + ".oci.tar",
        "notes.txt",
    ]
    for name in names:
        (tmp_path / name).write_text("")
    keep = tmp_path / names[2]
    gone = b.prune_archives(tmp_path, b.VARIANTS["train"], keep)
    assert [p.name for p in gone] == names[:2][::-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])


def test_the_context_leaves_out_the_local_cluster_and_examples():
    # make cluster keeps its state (etcd data, sockets) in .cluster/ under the repository; the
    # host tools (the control plane's cluster/, make image's imagebuild/) are in no image.
    patterns = b.dockerignore_patterns(ROOT)
    for path in (
        ".cluster/etcd/member/snap/db",
        "cluster/control_plane.py",
        "imagebuild/build.py",
        "imagebuild/recipes.py",
        "examples/run.yaml",
        ".gitignore",
    ):
        assert b.is_ignored(path, patterns), path


def test_a_fresh_checkout_takes_the_caches_archive_of_the_same_inputs(tmp_path, monkeypatch):
    # The archive is kept in the image cache (shared by every checkout on the machine) and
    # linked into output/: a fresh clone of the same commit (CI's) builds and saves nothing.
    monkeypatch.setenv("MEGDET_IMAGE_CACHE", str(tmp_path / "cache"))
    pins = b.image_pins(b.pyproject(ROOT))
    args = b.build_args(b.VARIANTS["controller"], b.pyproject(ROOT), "BASE", None, 1)
    key = b.json.dumps({k: pins[k] for k in ("debian_suite", "base_packages")})
    digest = b.inputs_digest(ROOT, "controller", args, [key, *b.ENGINE_FLAGS])
    kept = b.archive_path(tmp_path / "cache" / "archives", b.VARIANTS["controller"], digest)
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"the image")
    b._info_path(kept).write_text("{}")
    stale = b.archive_path(tmp_path / "out", b.VARIANTS["controller"], "0" * 64)
    stale.parent.mkdir()
    stale.write_bytes(b"an older build")
    monkeypatch.setattr(b, "ensure_tools", lambda: pytest.fail("built again"))
    archive = b.build("controller", output=tmp_path / "out")
    assert archive == b.archive_path(tmp_path / "out", b.VARIANTS["controller"], digest)
    assert archive.read_bytes() == b"the image" and archive.stat().st_ino == kept.stat().st_ino
    assert b._info_path(archive).read_text() == "{}"
    assert not stale.exists()
