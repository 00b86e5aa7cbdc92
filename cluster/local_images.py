"""The images this checkout built, in the real node's containerd: what ``make cluster`` loads
after it starts the node, and what ``make cluster-images`` (``python -m cluster
load-images``) loads into a cluster that is already up (docs/cluster.md, "Images you built").

``make image`` and ``make suite-images`` (imagebuild.build) leave one OCI archive per variant
in ``output/images/``, named ``megdet-<variant>-<inputs digest>.oci.tar``; each archive's index
names its image (``ghcr.io/megdet/megdet:<version>``, ``...:<version>-ci``,
``ghcr.io/megdet/megdet-controller:<version>``), which is the name the charts' pods ask for.
Nothing is pulled on the node, so a pod uses them with ``imagePullPolicy: Never`` (or
``IfNotPresent``). An image the node already holds at the archive's digest is not imported
again. ``make cluster`` also links the pinned ``kubectl`` and ``helm`` into ``<state>/bin``, so
that one ``PATH`` entry gives the clients the cluster was built with.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cluster import build, oci
from cluster.control_plane import ROOT, Cluster, ClusterError
from cluster.node import NODE_NAME, RealNode, ctr, images, import_image
from imagebuild.build import VARIANTS

#: Where imagebuild.build leaves each variant's archive (its default ``output``).
ARCHIVES = ROOT / "output" / "images"
#: The Makefile targets that build each variant, for the message when none is built.
BUILD_HINT = (
    "run `make suite-images` (the e2e training image and the controller) or `make image` "
    "(the training image with its CUDA build and the controller), then `make cluster-images`"
)
#: The pinned clients ``make cluster`` links into ``<state>/bin`` (build.binary_path names).
CLIENTS = ("kubectl", "helm")


def built_archives(folder: Path = ARCHIVES) -> dict[str, Path]:
    """Each variant's archive in ``folder``: variant name -> path (the newest, should there be
    more than one), in imagebuild.build's variant order."""
    found: dict[str, Path] = {}
    for name in VARIANTS:
        mine = re.compile(rf"megdet-{re.escape(name)}-[0-9a-f]{{16}}\.oci\.tar")
        paths = [p for p in folder.glob("*.oci.tar") if mine.fullmatch(p.name)]
        if paths:
            found[name] = max(paths, key=lambda p: p.stat().st_mtime)
    return found


def resolve(requested: Sequence[str], folder: Path = ARCHIVES) -> list[Path]:
    """The archives ``requested`` names: variant names (their built archive) or archive files;
    all built variants when ``requested`` is empty. ClusterError names what is missing."""
    built = built_archives(folder)
    if not requested:
        return list(built.values())
    paths = []
    for item in requested:
        if item in VARIANTS:
            if item not in built:
                raise ClusterError(
                    f"no {item} image is built (no megdet-{item}-*.oci.tar in {folder}): "
                    f"run `python -m imagebuild.build {item}`"
                )
            paths.append(built[item])
        elif Path(item).is_file():
            paths.append(Path(item).resolve())
        else:
            raise ClusterError(
                f"{item}: no such archive file, and not an image variant (one of "
                f"{', '.join(VARIANTS)}, built into {folder})"
            )
    return paths


def _held_digests(sock: Path) -> dict[str, str]:
    """Image name -> target digest, of what the node's containerd holds."""
    listed = ctr(sock, "images", "ls").stdout.splitlines()[1:]
    return {parts[0]: parts[2] for parts in (line.split() for line in listed) if len(parts) > 2}


def _archive_digests(archive: Path) -> dict[str, str]:
    """Image name -> manifest digest, of the images ``archive``'s index names."""
    try:
        with tarfile.open(archive) as tar:
            member = tar.extractfile("index.json")
            index = json.load(member) if member else {}
        names = oci.archive_names(archive)
    except (OSError, ValueError, KeyError, tarfile.TarError) as err:
        raise ClusterError(
            f"{archive}: not an OCI archive with an index.json ({err}); `make image` and "
            "`podman save --format oci-archive` write them"
        ) from None
    digests = [d.get("digest", "") for d in index.get("manifests", [])]
    return dict(zip(names, digests, strict=False))


def load_images(
    cluster: Cluster,
    requested: Sequence[str] = (),
    *,
    folder: Path = ARCHIVES,
    echo: Callable[[str], None] = print,
    timeout: float = 1800,
    required: bool = False,
) -> list[str]:
    """Import the archives ``requested`` names (default: every variant built into ``folder``)
    into the real node of ``cluster``; returns the image names the node holds from them.
    ClusterError (with the fix) when the cluster or its real node is not up, or an archive is
    missing; with nothing built, says what to build and returns [] (raises if ``required``)."""
    state = cluster.state()
    if not state or not cluster.is_up():
        raise ClusterError(f"no running cluster in {cluster.root}: run `make cluster` first")
    if "node" not in state or not cluster.running("kubelet", state):
        raise ClusterError(
            f"the cluster in {cluster.root} has no real node {NODE_NAME} (started without it, "
            "or it could not start: `make cluster` said why), so nothing runs images; "
            "`make cluster-down`, then `make cluster`"
        )
    archives = resolve(requested, folder)
    if not archives:
        if required:
            raise ClusterError(f"no image built yet in {folder}: {BUILD_HINT}")
        echo(f"no image built yet in {folder}: {BUILD_HINT}")
        return []
    sock = RealNode(cluster, echo=echo).socket
    held = _held_digests(sock)
    loaded: list[str] = []
    for archive in archives:
        wanted = _archive_digests(archive)
        if wanted and all(held.get(name) == digest for name, digest in wanted.items()):
            echo(f"{', '.join(wanted)}: already on {NODE_NAME} ({archive.name})")
            loaded += list(wanted)
            continue
        start = time.monotonic()
        names = import_image(sock, archive, timeout=timeout)
        echo(
            f"loaded {', '.join(names)} into {NODE_NAME} from {archive} "
            f"({archive.stat().st_size / 1e9:.1f} GB, {time.monotonic() - start:.0f} s)"
        )
        loaded += names
    held_now = images(sock)
    absent = [n for n in loaded if n not in held_now]
    if absent:
        raise ClusterError(f"{NODE_NAME} lost {', '.join(absent)} after the import")
    echo(
        "pods on the node run them with imagePullPolicy Never or IfNotPresent (nothing is "
        'pulled): README.md, "Try it locally"'
    )
    return loaded


def link_clients(cluster: Cluster) -> Path:
    """Link the pinned kubectl and helm into ``<state>/bin``; returns that folder."""
    folder = cluster.root / "bin"
    folder.mkdir(exist_ok=True)
    for name in CLIENTS:
        target = build.binary_path(name)
        link = folder / name
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(target, link)
    return folder
