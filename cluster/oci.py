"""OCI image archives assembled by hand from files on this machine (no engine, nothing pulled).

The real node runs three images that nothing else builds: the pause (sandbox) image from
upstream's ``build/pause/linux/pause.c``, CoreDNS from its Go module, and a test image with
Debian's static busybox. Each is one uncompressed layer with a config, a manifest and an index
in an OCI image layout, tarred: the format ``ctr images import`` reads (OCI image-spec
``image-layout.md``). containerd names an imported image by the index entry's
``io.containerd.image.name`` annotation. Layers are deterministic (mtime 0, root-owned), so the
same inputs give the same digests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

LAYOUT_VERSION = "1.0.0"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One file, folder or symlink of a layer."""

    path: str  # inside the image, without a leading slash
    source: Path | None = None  # a file on this machine
    data: bytes | None = None  # or the bytes themselves
    mode: int = 0o644
    symlink: str | None = None
    directory: bool = False


def _tarinfo(entry: Entry) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(entry.path.lstrip("/"))
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = entry.mode
    if entry.directory:
        info.type = tarfile.DIRTYPE
        return info, None
    if entry.symlink is not None:
        info.type = tarfile.SYMTYPE
        info.linkname = entry.symlink
        info.mode = 0o777
        return info, None
    data = entry.data if entry.data is not None else Path(entry.source).read_bytes()
    info.size = len(data)
    return info, data


def layer_tar(entries: Sequence[Entry]) -> bytes:
    """An uncompressed layer with ``entries`` and the folders above them, in path order."""
    folders = {
        "/".join(parts[:i])
        for e in entries
        for parts in [e.path.strip("/").split("/")]
        for i in range(1, len(parts))
    }
    all_entries = [Entry(f, directory=True, mode=0o755) for f in folders]
    all_entries += [e for e in entries if e.path.strip("/") not in folders]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(all_entries, key=lambda e: e.path.strip("/")):
            info, data = _tarinfo(entry)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_archive(
    path: Path,
    name: str,
    entries: Sequence[Entry],
    entrypoint: Sequence[str] = (),
    cmd: Sequence[str] = (),
    user: str = "",
    env: Mapping[str, str] | None = None,
    workdir: str = "",
) -> str:
    """Write an OCI archive of a one-layer linux/amd64 image named ``name`` (a full reference,
    ``registry/repo:tag``) to ``path``; returns the manifest's digest."""
    if ":" not in name.rsplit("/", 1)[-1]:
        raise ValueError(f"image name {name!r} needs a tag (registry/repo:tag)")
    layer = layer_tar(entries)
    blobs: dict[str, bytes] = {}
    layer_desc = _blob(blobs, layer, MEDIA_LAYER)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **(env or {})}
    config: dict[str, Any] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": [f"{k}={v}" for k, v in env.items()]},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        "history": [{"created_by": "cluster.oci", "created": "1970-01-01T00:00:00Z"}],
        "created": "1970-01-01T00:00:00Z",
    }
    for key, value in (
        ("Entrypoint", list(entrypoint)),
        ("Cmd", list(cmd)),
        ("User", user),
        ("WorkingDir", workdir),
    ):
        if value:
            config["config"][key] = value
    config_desc = _blob(blobs, _json(config), MEDIA_CONFIG)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config_desc,
        "layers": [layer_desc],
    }
    manifest_desc = _blob(blobs, _json(manifest), MEDIA_MANIFEST)
    manifest_desc["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
    }
    manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [manifest_desc]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        files = {
            "oci-layout": _json({"imageLayoutVersion": LAYOUT_VERSION}),
            "index.json": _json(index),
            **{f"blobs/sha256/{d.split(':', 1)[1]}": data for d, data in sorted(blobs.items())},
        }
        for folder in ("blobs", "blobs/sha256"):
            tar.addfile(_tarinfo(Entry(folder, directory=True, mode=0o755))[0])
        for member, data in files.items():
            info, _ = _tarinfo(Entry(member, data=data))
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(path)
    return manifest_desc["digest"]


def archive_names(path: Path) -> list[str]:
    """The image names an OCI archive's index gives (its ``io.containerd.image.name``
    annotations, else its ``org.opencontainers.image.ref.name`` ones)."""
    with tarfile.open(path) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{path}: no index.json (not an OCI archive)")
        index = json.load(member)
    names = []
    for desc in index.get("manifests", []):
        ann = desc.get("annotations", {})
        name = ann.get("io.containerd.image.name") or ann.get("org.opencontainers.image.ref.name")
        if name:
            names.append(name)
    return names
