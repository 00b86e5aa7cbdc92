"""`make image`: the project's images from the one Dockerfile, built from package registries only.

The Dockerfile's defaults are this build's recipe (``docker build .`` on a machine with a
registry builds the same stages with the same arguments): Debian 12, its Python, torch and its
CUDA libraries from PyPI (PyPI's torch is a CUDA build: its ``nvidia-*`` wheels carry the CUDA
runtime, cuDNN and NCCL), detectron2 from the pinned PyPI wheel's Python code
(``DETECTRON2_SOURCE=pypi``: no registry serves its C++/CUDA sources). This builds them with
Debian's podman (buildah inside) and nothing pulled from a container registry:

- the base of every stage is a Debian image made here by ``mmdebstrap`` from Debian's packages
  (``[tool.megdet.image]``), imported into the engine's store, instead of the registry's;
- given a git repository holding the pinned commit (``--detectron2-src``, e.g. a bare clone),
  detectron2 is built from it with its ops compiled (nvcc from NVIDIA's PyPI wheels): the arg
  set ``[tool.megdet.image.arg_sets]`` names for the variant (imagebuild/recipes.py).

Each variant's OCI archive is kept in the cache folder (``archives/``) under a name that carries
the digest of its inputs (the Dockerfile, the build context, the build args, the base image's
inputs) and linked into ``output/images/``, so a second call with the same inputs, from this
checkout or from a fresh clone of the same commit, returns the archive at once::

    python -m imagebuild.build controller train     # what `make image` runs
    python -m imagebuild.build train-ci              # the e2e tests' variant

    from imagebuild.build import build
    archive = build("train-ci")                        # Path to the .oci.tar

Engine settings that this machine needs (runc, cgroupfs, ulimits within the hard limits, the
host's CA bundle for HTTPS to PyPI) are written to a containers.conf in the cache folder
(``$MEGDET_IMAGE_CACHE``, default ``~/.cache/megdet/image``), which also holds the engine's own
image store, so nothing touches the machine's default podman store. That store is bounded: after
each build, the images that no current variant uses (the previous build of a variant whose
inputs changed, and its layers, GBs for the training image) are removed, and the layers of the
current builds are kept as the next build's cache (``prune_store``). That cache includes a
training variant's image: its venv layer is a 6 GB copy of the build stage's
(``COPY --from=build``), which a code change's rebuild takes from the cache instead of copying
again (about 90 s less per code change, for 6 GB more at rest: docs/benchmarks.md, "The
training image kept in the store"). What an interrupted engine left in its temporary folder is
removed before the next build (``clear_stale_tmp``), and so are the build containers it left in
the store (``clear_stale_containers``). Builds from two processes take turns (a lock in the
cache folder).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from imagebuild import disk, recipes

ROOT = Path(__file__).resolve().parent.parent
#: Where a git source given with --detectron2-src is mounted during the build.
DETECTRON2_MOUNT = "/opt/detectron2-src.git"
#: The host's CA bundle (also what pip is told to use inside the build).
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
#: Debian packages `make image` installs when missing (root only; CI machines are fresh).
TOOLS = {"podman": "podman", "buildah": "buildah", "mmdebstrap": "mmdebstrap", "runc": "runc"}
#: podman build's flags that shape the image (part of the inputs' digest). --format docker:
#: buildah ignores SHELL (the build stage's pipefail) in its OCI format; `podman save` writes
#: an OCI archive either way.
ENGINE_FLAGS = ("--layers", "--pull=never", "--format", "docker")
#: Measured here: runc's setrlimit(RLIMIT_NPROC) fails above 32768 even under a hard limit of
#: 96362 ("error setting rlimit type 6: operation not permitted"); 32768 works.
NPROC_CAP = 32768
EXTRA_PACKAGES = ("uidmap", "fuse-overlayfs", "slirp4netns", "containernetworking-plugins")


class BuildError(Exception):
    """A build that cannot go on; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """One image the Dockerfile builds: its target stage and how its detectron2 is built."""

    name: str
    target: str
    image: str  # repository, tagged with the project's version (+ suffix)
    tag_suffix: str = ""
    description: str = ""


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("controller", "controller", "ghcr.io/megdet/megdet-controller",
                description="the MegDetRun operator (no torch)"),
        Variant("train", "train", "ghcr.io/megdet/megdet",
                description="the training image; detectron2's CUDA ops with a git source"),
        Variant("train-ci", "train", "ghcr.io/megdet/megdet", tag_suffix="-ci",
                description="the e2e tests' training image: the same stages, C++ ops only"),
    )
}  # fmt: skip


def say(message: str) -> None:
    print(f"image: {message}", flush=True)


# ------------------------------------------------------------------------------------------
# pins and settings


def pyproject(root: Path = ROOT) -> dict:
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def image_pins(data: Mapping) -> dict:
    """``[tool.megdet.image]``: the Debian base this build makes instead of the registry's."""
    try:
        return dict(data["tool"]["megdet"]["image"])
    except KeyError as exc:
        raise BuildError("pyproject.toml has no [tool.megdet.image] table") from exc


def cache_dir() -> Path:
    return Path(os.environ.get("MEGDET_IMAGE_CACHE", Path.home() / ".cache/megdet/image"))


def containers_conf(nofile: int, nproc: int, tmp: Path) -> str:
    """The engine settings this machine needs (docs/image.md, "make image")."""
    return (
        "# Written by imagebuild.build. runc: crun refuses cgroup v1 hybrid hosts;\n"
        "# ulimits no higher than this host's hard limits (root may lack CAP_SYS_RESOURCE).\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'image_copy_tmp_dir = "{tmp}"\n'
    )


def storage_conf(root: Path) -> str:
    return (
        "# Written by imagebuild.build: the image builds' own store.\n"
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{root / "storage"}"\n'
        f'runroot = "{root / "run"}"\n'
    )


def hard_limit(which: int, cap: int) -> int:
    hard = resource.getrlimit(which)[1]
    return cap if hard == resource.RLIM_INFINITY else min(hard, cap)


def engine_env(cache: Path) -> dict[str, str]:
    """The environment for podman: our containers.conf and storage.conf."""
    cache.mkdir(parents=True, exist_ok=True)
    conf = cache / "containers.conf"
    (cache / "tmp").mkdir(exist_ok=True)
    nofile = hard_limit(resource.RLIMIT_NOFILE, 1 << 20)
    conf.write_text(
        containers_conf(nofile, hard_limit(resource.RLIMIT_NPROC, NPROC_CAP), cache / "tmp")
    )
    storage = cache / "storage.conf"
    storage.write_text(storage_conf(cache))
    pip_conf = cache / "pip.conf"
    pip_conf.write_text(f"[global]\ncert = {CA_BUNDLE}\n")
    return {**os.environ, "CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage)}


def ensure_tools() -> None:
    """Install Debian's podman, buildah, mmdebstrap and runc when any is missing."""
    missing = [pkg for tool, pkg in TOOLS.items() if not shutil.which(tool)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise BuildError(
            f"{', '.join(missing)} not installed and not root: run "
            f"`sudo apt-get install {' '.join([*missing, *EXTRA_PACKAGES])}`"
        )
    say(f"installing Debian packages: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Two builds at once (make -j2) may both install: the second waits for dpkg's lock.
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
    subprocess.run([*apt, "update", "-qq"], check=True, env=env)
    subprocess.run(
        [*apt, "install", "-y", "-qq", "--no-install-recommends", *missing, *EXTRA_PACKAGES],
        check=True,
        env=env,
    )


# ------------------------------------------------------------------------------------------
# the build context and the inputs' digest


def dockerignore_patterns(root: Path = ROOT) -> list[str]:
    path = root / ".dockerignore"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def is_ignored(relpath: str, patterns: Sequence[str]) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; ``!`` re-includes.

    A pattern matches a path or any folder above it (``tests`` drops ``tests/a.py``).
    """
    parts = relpath.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.removeprefix("!").strip("/")
        if any(fnmatch.fnmatchcase(p, pat) for p in prefixes):
            ignored = not negate
    return ignored


def context_files(root: Path = ROOT) -> list[str]:
    """The build context: every file under ``root`` that .dockerignore keeps, sorted."""
    patterns = dockerignore_patterns(root)
    negated = [p.removeprefix("!").strip("/") for p in patterns if p.startswith("!")]
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root).as_posix()
        rel = "" if rel == "." else rel + "/"
        # Prune ignored folders unless a "!" pattern re-includes something below them.
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not is_ignored(rel + d, patterns)
            or any(n.startswith(rel + d + "/") for n in negated)
        )
        files += [rel + f for f in filenames if not is_ignored(rel + f, patterns)]
    return sorted(files)


def inputs_digest(
    root: Path, target: str, build_args: Mapping[str, str], extra: Iterable[str] = ()
) -> str:
    """sha256 over the Dockerfile, .dockerignore and the context's files (names, modes, bytes),
    the target, the build args and extras."""
    h = hashlib.sha256()
    for rel in ["Dockerfile", ".dockerignore", *context_files(root)]:
        if not (root / rel).is_file():
            continue
        path = root / rel
        h.update(f"file {rel} {path.stat().st_mode & 0o111:o}\n".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    h.update(f"target {target}\n".encode())
    for key in sorted(build_args):
        h.update(f"arg {key}={build_args[key]}\n".encode())
    for item in extra:
        h.update(f"extra {item}\n".encode())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------
# the base image


def base_command(pins: Mapping, out: Path, sources: Path) -> list[str]:
    """mmdebstrap: a minimal Debian with what every stage needs before its own apt-get."""
    return [
        "mmdebstrap",
        "--variant=minbase",
        "--include=" + ",".join(pins["base_packages"]),
        "--format=tar",
        pins["debian_suite"],
        str(out),
        str(sources),
    ]


def apt_sources() -> Path:
    """This machine's Debian sources (deb822 or one-line), handed to mmdebstrap as they are."""
    for path in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        if path.is_file():
            return path
    raise BuildError("no /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list")


def base_image(pins: Mapping, cache: Path, env: Mapping[str, str]) -> str:
    """The Debian base, imported into the engine's store as ``localhost/megdet-base:<digest>``."""
    sources = apt_sources()
    key = hashlib.sha256(
        json.dumps(
            {
                "cmd": base_command(pins, Path("OUT"), Path("SOURCES")),
                "sources": sources.read_text(),
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()[:16]
    name = f"localhost/megdet-base:{pins['debian_suite']}-{key}"
    if image_exists(name, env):
        return name
    tar = cache / f"base-{key}.tar"
    if not tar.exists():
        start = time.monotonic()
        tmp = tar.with_suffix(".tmp.tar")
        say(f"making the Debian base with mmdebstrap ({pins['debian_suite']})")
        subprocess.run(base_command(pins, tmp, sources), check=True)
        tmp.rename(tar)
        say(f"base made in {time.monotonic() - start:.0f} s: {tar.stat().st_size / 1e6:.0f} MB")
    subprocess.run(
        ["podman", "import", "--change", 'CMD ["/bin/bash"]', str(tar), name],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return name


def image_exists(name: str, env: Mapping[str, str]) -> bool:
    return (
        subprocess.run(
            ["podman", "image", "exists", name], env=env, capture_output=True, check=False
        ).returncode
        == 0
    )


# ------------------------------------------------------------------------------------------
# the build


#: The recipe's choices that make image writes out even where they are the Dockerfile's
#: defaults, so that its command line (printed) and its layers' history name them.
RECIPE_ARGS = ("PYTHON", "TORCH_INDEX_URL", "DETECTRON2_SOURCE")
#: What make image supplies itself where `docker build` with the same set takes the Dockerfile's
#: value: the Debian base made here, the mounted detectron2 source, the compile jobs.
LOCAL_ARGS = ("BUILD_BASE", "RUNTIME_BASE", "CONTROLLER_BASE", "DETECTRON2_REPO", "MAX_JOBS")


def arg_set(variant: Variant, data: Mapping, detectron2_commit: str | None) -> recipes.ArgSet:
    """The arg set (``[tool.megdet.image.arg_sets]``) that ``variant`` is built with."""
    with_source = bool(detectron2_commit) and variant.target == "train"
    try:
        return recipes.arg_set_for(recipes.arg_sets(data), variant.name, with_source)
    except recipes.RecipeError as exc:
        raise BuildError(str(exc)) from exc


def build_args(
    variant: Variant,
    data: Mapping,
    base: str,
    detectron2_commit: str | None,
    jobs: int,
    root: Path = ROOT,
) -> dict[str, str]:
    """The Dockerfile's build args for a registry-only build of ``variant``: its arg set over the
    Dockerfile's defaults, with the local ``base`` and detectron2 source (``LOCAL_ARGS``)."""
    chosen = arg_set(variant, data, detectron2_commit)
    dockerfile = recipes.dockerfile_text(root)
    values = {**recipes.global_args(dockerfile), **chosen.args}
    if variant.target == "controller":
        return {"CONTROLLER_BASE": base}
    args = {"BUILD_BASE": base, "RUNTIME_BASE": base}
    args.update({name: values[name] for name in (*RECIPE_ARGS, *chosen.args)})
    if values["DETECTRON2_SOURCE"] == "git":
        if not detectron2_commit:
            raise BuildError(f"arg set {chosen.name}: detectron2 from git needs --detectron2-src")
        args.update(
            DETECTRON2_REPO=DETECTRON2_MOUNT,
            DETECTRON2_COMMIT=detectron2_commit,
            TORCH_CUDA_ARCH_LIST=values["TORCH_CUDA_ARCH_LIST"],
            MAX_JOBS=str(jobs),
        )
    return args


def build_command(
    variant: Variant,
    args: Mapping[str, str],
    tag: str,
    cache: Path,
    detectron2_src: Path | None,
    root: Path = ROOT,
    iidfile: Path | None = None,
) -> list[str]:
    """``podman build`` of one target, with the host's CA bundle and pip.conf mounted read-only
    (``iidfile``: where podman writes the id of the image it built)."""
    cmd = ["podman", "build", *ENGINE_FLAGS, "--target", variant.target, "--tag", tag,
           "--file", str(root / "Dockerfile")]  # fmt: skip
    if iidfile is not None:
        cmd += ["--iidfile", str(iidfile)]
    for key in sorted(args):
        cmd += ["--build-arg", f"{key}={args[key]}"]
    cmd += ["--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
    cmd += ["--volume", f"{cache / 'pip.conf'}:/etc/pip.conf:ro"]
    if detectron2_src is not None:
        cmd += ["--volume", f"{detectron2_src}:{DETECTRON2_MOUNT}:ro"]
    return [*cmd, str(root)]


def git_commit_in(src: Path, commit: str) -> None:
    """Refuse a --detectron2-src that does not hold the pinned commit."""
    out = subprocess.run(
        ["git", "--git-dir", str(_git_dir(src)), "cat-file", "-t", commit],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.stdout.strip() != "commit":
        raise BuildError(f"--detectron2-src: {src} does not hold the pinned commit {commit}")


def _git_dir(src: Path) -> Path:
    return src / ".git" if (src / ".git").exists() else src


def prune_archives(output: Path, variant: Variant, keep: Path) -> list[Path]:
    """Delete ``variant``'s older archives (other digests) in ``output``; the training image's
    are GBs each, one per code change. Returns what was deleted."""
    mine = re.compile(rf"megdet-{re.escape(variant.name)}-[0-9a-f]{{16}}\.oci\.(tar|json)")
    keep_stem = keep.name.removesuffix(".tar")
    gone = sorted(
        p
        for p in output.iterdir()
        if mine.fullmatch(p.name) and p.name.rpartition(".")[0] != keep_stem
    )
    for path in gone:
        path.unlink()
    return gone


def place(kept: Path, archive: Path) -> None:
    """Put the cache's archive (and its .json) at ``archive``: a hard link, a copy across
    filesystems."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    for src, dst in ((kept, archive), (_info_path(kept), _info_path(archive))):
        if not src.exists():
            continue
        tmp = dst.with_name(dst.name + ".tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        tmp.rename(dst)


def _info_path(archive: Path) -> Path:
    return archive.with_name(archive.name.removesuffix(".tar") + ".json")


def tag_for(variant: Variant, version: str) -> str:
    return f"{variant.image}:{version}{variant.tag_suffix}"


def archive_path(output: Path, variant: Variant, digest: str) -> Path:
    return output / f"megdet-{variant.name}-{digest[:16]}.oci.tar"


def build(
    variant_name: str,
    *,
    detectron2_src: Path | str | None = None,
    output: Path | None = None,
    jobs: int | None = None,
    root: Path = ROOT,
) -> Path:
    """Build ``variant_name`` (unless its archive for these inputs exists); return the archive."""
    if variant_name not in VARIANTS:
        raise BuildError(f"variant {variant_name!r}: not one of {', '.join(VARIANTS)}")
    variant = VARIANTS[variant_name]
    data = pyproject(root)
    pins = image_pins(data)
    output = Path(output or root / "output" / "images")
    src = Path(detectron2_src).resolve() if detectron2_src else None
    commit = data["tool"]["megdet"]["detectron2_commit"] if src else None
    if src is not None:
        git_commit_in(src, commit)
    jobs = jobs or int(os.environ.get("MAX_JOBS", os.cpu_count() or 1))
    # The base's inputs stand in for the base image's id, so the key is known before a build.
    base_key = json.dumps({k: pins[k] for k in ("debian_suite", "base_packages")})
    provisional = build_args(variant, data, "BASE", commit, jobs, root)
    provisional.pop("MAX_JOBS", None)  # the job count does not change what is built
    digest = inputs_digest(root, variant.target, provisional, [base_key, *ENGINE_FLAGS])
    archive = archive_path(output, variant, digest)
    if archive.exists():
        say(f"{variant.name}: up to date ({archive})")
        return archive
    cache = cache_dir()
    kept = archive_path(cache / "archives", variant, digest)
    if kept.exists():
        place(kept, archive)
        prune_archives(output, variant, keep=archive)
        say(f"{variant.name}: up to date (the cache's archive of these inputs, {kept})")
        return archive
    ensure_tools()
    with build_lock(cache):
        if kept.exists():  # built by the process this one waited for
            place(kept, archive)
            prune_archives(output, variant, keep=archive)
            say(f"{variant.name}: up to date (built meanwhile, {kept})")
            return archive
        return _build_locked(variant, data, pins, commit, jobs, src, root, digest, kept, archive)


def _build_locked(
    variant: Variant,
    data: Mapping,
    pins: Mapping,
    commit: str | None,
    jobs: int,
    src: Path | None,
    root: Path,
    digest: str,
    kept: Path,
    archive: Path,
) -> Path:
    cache = cache_dir()
    output = archive.parent
    env = engine_env(cache)
    cleared = clear_stale_tmp(cache / "tmp")
    if cleared:
        say(f"removed {cleared} left in the engine's temporary folder by an interrupted run")
    stale = clear_stale_containers(env)
    if stale:
        say(f"removed {stale} build containers an interrupted build left in the store")
    # This variant's older archives go before the build, not after it: 3.3 GB of the peak.
    kept.parent.mkdir(parents=True, exist_ok=True)
    prune_archives(kept.parent, variant, keep=kept)
    check_disk(variant, cache, env)
    base = base_image(pins, cache, env)
    tag = tag_for(variant, data["project"]["version"])
    iidfile = cache / f"iid-{digest[:16]}"
    iidfile.unlink(missing_ok=True)
    args = build_args(variant, data, base, commit, jobs, root)
    cmd = build_command(variant, args, tag, cache, src, root, iidfile=iidfile)
    say(f"{variant.name}: building {tag}")
    say("$ " + " ".join(cmd))
    start = time.monotonic()
    subprocess.run(cmd, check=True, env=env)
    built = time.monotonic() - start
    # Save exactly the image this build made (an interrupted build may leave the tag on an
    # older one): the id podman wrote, tagged again.
    if not iidfile.is_file() or not iidfile.read_text().strip():
        raise BuildError(f"podman build wrote no image id ({iidfile}): the build did not finish")
    subprocess.run(["podman", "tag", iidfile.read_text().strip(), tag], check=True, env=env)
    iidfile.unlink()
    kept.parent.mkdir(parents=True, exist_ok=True)
    tmp = kept.with_name(kept.name + ".tmp")
    tmp.unlink(missing_ok=True)
    subprocess.run(
        ["podman", "save", "--format", "oci-archive", "--output", str(tmp), tag],
        check=True,
        env=env,
    )
    info = describe(tmp)
    info.update(archive=str(kept), variant=variant.name, tag=tag, build_seconds=round(built, 1))
    _info_path(kept).write_text(json.dumps(info, indent=2) + "\n")
    tmp.rename(kept)
    prune_archives(kept.parent, variant, keep=kept)
    place(kept, archive)
    prune_archives(output, variant, keep=archive)
    saved = time.monotonic() - start - built
    removed = settle_store(variant, cmd, env)
    say(
        f"{variant.name}: built in {built:.0f} s, saved in {saved:.0f} s"
        + (f"; {removed} unused images removed from the build store" if removed else "")
    )
    return archive


def check_disk(variant: Variant, cache: Path, env: Mapping[str, str]) -> None:
    """Refuse to start a build that the free space of the cache's file system cannot hold
    (imagebuild/disk.py: what a build needs, measured)."""
    cached = variant.target == "train" and image_exists(stage_tag(variant), env)
    try:
        need = disk.need_gib(variant.target, cached)
    except ValueError as err:
        raise BuildError(str(err)) from None
    problem = disk.shortfall(cache, need, f"{variant.name}'s build")
    if problem:
        raise BuildError(problem)


@contextlib.contextmanager
def build_lock(cache: Path):
    """One build at a time per cache folder (the store's pruning removes what no tagged image
    uses, which includes the newest step of a build still running)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def stage_tag(variant: Variant) -> str:
    """The tag that keeps a training variant's build stage (and so its torch layers) in the
    store as the next build's cache; the train stage copies from it and is not its child."""
    return f"localhost/megdet-stage:{variant.name}"


def settle_store(variant: Variant, cmd: Sequence[str], env: Mapping[str, str]) -> int:
    """After a build saved by ``cmd``: keep its stage and its image as the next build's cache,
    remove what no current variant uses; returns how many images went."""
    keep_stage(variant, cmd, env)
    return prune_store(env)


def keep_stage(variant: Variant, cmd: Sequence[str], env: Mapping[str, str]) -> None:
    """Tag the build stage that ``cmd`` (a train target's build) used: the same command for
    target ``build``, every step a cache hit."""
    if variant.target != "train":
        return
    stage = list(cmd)
    stage[stage.index("--target") + 1] = "build"
    stage[stage.index("--tag") + 1] = stage_tag(variant)
    if "--iidfile" in stage:
        i = stage.index("--iidfile")
        del stage[i : i + 2]
    subprocess.run(stage, check=True, env=env, stdout=subprocess.DEVNULL)


#: An entry of the engine's temporary folder untouched this long belongs to no running engine:
#: a `podman save` of the training image writes its files continuously for about 90 s.
STALE_TMP_SECONDS = 3600


def clear_stale_tmp(tmp: Path, older_than: float = STALE_TMP_SECONDS) -> str:
    """Remove what an interrupted engine left in its temporary folder (``image_copy_tmp_dir``):
    a killed `podman save` of the training image left 7.6 GB there, which no later run
    removed. Only entries not modified for ``older_than`` seconds go (a `podman load` outside
    the build lock may be writing the others). Returns how much was removed, in words ("" for
    nothing)."""
    if not tmp.is_dir():
        return ""
    cutoff = time.time() - older_than
    freed = count = 0
    for entry in tmp.iterdir():
        try:
            if _newest_mtime(entry) > cutoff:
                continue
            size = _size(entry)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError:
            continue  # gone meanwhile, or not ours to remove: left
        freed += size
        count += 1
    return f"{count} entries ({freed / 1e9:.1f} GB)" if count else ""


def clear_stale_containers(env: Mapping[str, str]) -> int:
    """Remove the working containers an interrupted build left in the store (a killed ``podman
    build`` leaves its buildah containers behind; ``podman image prune`` keeps every image under
    one, and once exited 125 on them: "image is in use by a container"). Called under the lock,
    so no build of ours is using them: builds take turns, and nothing else makes buildah
    containers in this store. Returns how many were removed."""
    out = subprocess.run(
        ["buildah", "containers", "--quiet"], env=env, capture_output=True, text=True, check=True
    )
    ids = out.stdout.split()
    if ids:
        subprocess.run(["buildah", "rm", *ids], env=env, capture_output=True, check=True)
    return len(ids)


def _newest_mtime(path: Path) -> float:
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for sub in path.rglob("*"):
            with contextlib.suppress(OSError):
                newest = max(newest, sub.lstat().st_mtime)
    return newest


def _size(path: Path) -> int:
    if path.is_dir() and not path.is_symlink():
        total = 0
        for sub in path.rglob("*"):
            with contextlib.suppress(OSError):
                if sub.is_file() and not sub.is_symlink():
                    total += sub.lstat().st_size
        return total
    return path.lstat().st_size


def prune_store(env: Mapping[str, str], rounds: int = 50) -> int:
    """Remove the store's dangling images until none is left: an image is dangling when it has
    no tag and no child, so the current variants, their stages and every layer below them stay
    (the next build's cache); a previous build's chain goes one image per round. Returns how
    many were removed."""
    removed = 0
    for _ in range(rounds):
        out = subprocess.run(
            ["podman", "image", "prune", "--force"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        ids = out.stdout.split()
        if not ids:
            break
        removed += len(ids)
    return removed


def load(archive: Path) -> tuple[str, dict[str, str]]:
    """Make sure ``archive``'s image is in the build store; return its ref and the engine env."""
    env = engine_env(cache_dir())
    ref = describe(archive)["ref"]
    if not ref or not image_exists(ref, env):
        out = subprocess.run(
            ["podman", "load", "--input", str(archive)], env=env, capture_output=True, text=True
        )
        if out.returncode:
            raise BuildError(f"podman load {archive}: {out.stderr.strip()}")
        ref = ref or out.stdout.strip().rpartition(" ")[2]
    return ref, env


def run_in_image(
    archive: Path, args: Sequence[str], *, entrypoint: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Run the image's entrypoint (or ``entrypoint``) with ``args`` (podman, runc, no
    network); output captured. The training image's entrypoint is ``megdet launch``: pass
    ``entrypoint="megdet"`` for ``megdet doctor`` alone."""
    ref, env = load(archive)
    override = ["--entrypoint", entrypoint] if entrypoint else []
    return subprocess.run(
        ["podman", "run", "--rm", "--network", "none", *override, ref, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def describe(archive: Path) -> dict:
    """Size, manifest digest, user, entrypoint and cmd of an OCI archive (read from the tar)."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> dict:
            algo, _, hexd = digest.partition(":")
            return json.load(tar.extractfile(f"blobs/{algo}/{hexd}"))

        index = json.load(tar.extractfile("index.json"))
        (entry,) = index["manifests"]
        manifest = blob(entry["digest"])
        config = blob(manifest["config"]["digest"])
    cfg = config.get("config", {})
    return {
        "archive": str(archive),
        "archive_bytes": archive.stat().st_size,
        "layers_bytes": sum(layer["size"] for layer in manifest["layers"]),
        "digest": entry["digest"],
        "ref": entry.get("annotations", {}).get("org.opencontainers.image.ref.name"),
        "user": cfg.get("User", ""),
        "entrypoint": cfg.get("Entrypoint"),
        "cmd": cfg.get("Cmd"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m imagebuild.build", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "variants", nargs="*", default=["controller", "train"], help=", ".join(VARIANTS)
    )
    parser.add_argument(
        "--detectron2-src",
        default=os.environ.get("DETECTRON2_SRC") or None,
        help="a git repository (bare or not) holding the pinned detectron2 commit: compile its "
        "ops (default: $DETECTRON2_SRC; without it detectron2 is the PyPI wheel's Python code)",
    )
    parser.add_argument("--output", type=Path, help="default: output/images")
    parser.add_argument(
        "--jobs", type=int, help="parallel compile jobs (default: $MAX_JOBS or CPUs)"
    )
    args = parser.parse_args(argv)
    try:
        unknown = [v for v in args.variants if v not in VARIANTS]
        if unknown:
            raise BuildError(f"variant {unknown[0]!r}: not one of {', '.join(VARIANTS)}")
        archives = [
            build(v, detectron2_src=args.detectron2_src, output=args.output, jobs=args.jobs)
            for v in args.variants
        ]
    except BuildError as exc:
        print(f"image: error: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(
            f"image: error: {' '.join(map(str, exc.cmd))} exited {exc.returncode}", file=sys.stderr
        )
        return 1
    for archive in archives:
        info = describe(archive)
        print(
            f"{archive}\n  ref {info['ref']}  digest {info['digest']}\n"
            f"  archive {info['archive_bytes'] / 1e6:.0f} MB  user {info['user']}  "
            f"entrypoint {json.dumps(info['entrypoint'])}  cmd {json.dumps(info['cmd'])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
