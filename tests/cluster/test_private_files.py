"""What the cluster writes that grants access (keys, kubeconfigs, tokens) is its owner's alone
from the first byte, in folders only its owner opens, and the operators' webhook certificate
goes through no shared /tmp path."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from cluster import build, operators
from cluster.control_plane import Cluster
from cluster.pki import (
    CertificateAuthority,
    private_dir,
    service_account_keys,
    write_private,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def open_umask():
    """The most permissive umask: whatever the code does not restrict itself shows."""
    old = os.umask(0)
    yield
    os.umask(old)


def test_a_private_file_is_0600_and_replaces_a_planted_symlink(tmp_path: Path, open_umask) -> None:
    bait = tmp_path / "attacker-readable"
    bait.write_text("")
    target = tmp_path / "ca.key"
    target.symlink_to(bait)
    write_private(target, b"SECRET")
    assert bait.read_text() == ""  # the symlink was not followed
    assert not target.is_symlink() and target.read_bytes() == b"SECRET"
    assert mode(target) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_private_file_never_has_wider_modes_while_written(
    tmp_path: Path, open_umask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mode is given to open() itself: no moment at the umask's 0666 before a chmod."""
    seen: list[int] = []
    real_open = os.open

    def recording_open(path, flags, mode=0o777, *args, **kwargs):
        fd = real_open(path, flags, mode, *args, **kwargs)
        if flags & os.O_CREAT:
            seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return fd

    monkeypatch.setattr(os, "open", recording_open)
    write_private(tmp_path / "k", "x")
    assert seen == [0o600]


def test_private_dir_narrows_an_existing_folder_and_refuses_a_symlink(
    tmp_path: Path, open_umask
) -> None:
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o777)
    assert mode(private_dir(wide)) == 0o700
    assert mode(private_dir(tmp_path / "new" / "deeper")) == 0o700
    (tmp_path / "link").symlink_to(wide)
    with pytest.raises(OSError, match="not a folder"):
        private_dir(tmp_path / "link")


def test_private_dir_refuses_a_folder_someone_else_made_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its owner could open it up again after any chmod (a guessable name made by another
    user before the cluster's)."""
    made = tmp_path / "guessed"
    made.mkdir()
    monkeypatch.setattr(os, "geteuid", lambda: made.stat().st_uid + 1)
    with pytest.raises(OSError, match="belongs to another user"):
        private_dir(made)


def test_the_pki_keys_and_kubeconfigs_are_private(tmp_path: Path, open_umask) -> None:
    cluster = Cluster(root=tmp_path / "c")
    cluster.root.mkdir()
    ports = {"kube-apiserver": 6443}
    cluster._make_pki(ports, "127.0.0.1")
    assert mode(cluster.pki) == 0o700
    keys = sorted(cluster.pki.glob("**/*.key"))
    assert {str(k.relative_to(cluster.pki)) for k in keys} >= {
        "ca.key",
        "sa.key",
        "admin.key",
        "etcd/ca.key",
        "etcd/server.key",
        "etcd/apiserver-etcd-client.key",
    }
    for path in [*keys, *cluster.pki.glob("*.kubeconfig"), cluster.kubeconfig]:
        assert mode(path) == 0o600, path
    assert mode(cluster.pki / "etcd") == 0o700


def test_a_ca_and_the_service_account_key_are_private(tmp_path: Path, open_umask) -> None:
    ca = CertificateAuthority(tmp_path / "pki")
    _, key = ca.issue("leaf", "leaf", client=True)
    private, _ = service_account_keys(tmp_path / "pki")
    assert mode(tmp_path / "pki") == 0o700
    assert [mode(p) for p in (tmp_path / "pki" / "ca.key", key, private)] == [0o600] * 3


def test_up_makes_the_state_folder_private(tmp_path: Path, monkeypatch) -> None:
    """up() fails at the first component here (nothing built), after making the folder."""
    root = tmp_path / "c"
    monkeypatch.setattr(build, "is_built", lambda *a, **k: True)
    monkeypatch.setattr(Cluster, "_make_pki", lambda self, *a: None)

    def no_etcd(self, state):
        raise RuntimeError("stop here")

    monkeypatch.setattr(Cluster, "_start_etcd", no_etcd)
    with pytest.raises(RuntimeError, match="stop here"):
        Cluster(root=root, ports_mode="auto", echo=lambda _: None).up()
    assert mode(root) == 0o700


# --- the operators' webhook certificate ---------------------------------------------------------
def test_the_webhook_certificate_goes_to_the_clusters_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_umask
) -> None:
    monkeypatch.setenv("MEGDET_CLUSTER_CACHE", str(tmp_path / "cache"))
    cluster = Cluster(root=tmp_path / "c")
    folder = cluster.mount_webhook_certs()
    assert folder == tmp_path / "c" / "webhook-certs"
    assert sorted(p.name for p in folder.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert mode(folder) == 0o700 and mode(folder / "tls.key") == 0o600
    assert mode(Cluster.webhook_pki()) == 0o700
    assert mode(Cluster.webhook_pki() / "ca.key") == 0o600
    assert not hasattr(operators, "WEBHOOK_CERT_DIR")  # no host-wide folder any more


def test_the_operators_see_it_at_upstreams_path_in_a_private_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rotators hard-code /tmp/k8s-webhook-server/serving-certs: in a mount namespace of
    the operator's own, a tmpfs covers /tmp, the cluster's folder is bound at that path, and
    what the command needs of the host's /tmp (here the state folder) is bound back."""
    monkeypatch.setenv("MEGDET_CLUSTER_CACHE", str(tmp_path / "cache"))
    cluster = Cluster(root=tmp_path / "c")
    folder = cluster.mount_webhook_certs()
    (cluster.root / "probe").write_text("the state folder")
    upstream_top = Path(operators.UPSTREAM_CERT_DIR).parents[1]  # /tmp/k8s-webhook-server
    was_there = upstream_top.exists()
    script = (
        f"cat {operators.UPSTREAM_CERT_DIR}/tls.crt {cluster.root}/probe"
        " && echo && ls -A /tmp && stat -c %a /tmp"
    )
    proc = subprocess.run(
        cluster.private_mounts(["sh", "-c", script]),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    cert = (folder / "tls.crt").read_text()
    assert proc.stdout.startswith(cert + "the state folder\n")
    *listing, tmp_mode = proc.stdout[len(cert) :].splitlines()[1:]
    kept = (
        [tmp_path.resolve().relative_to("/tmp").parts[0]]
        if str(tmp_path).startswith("/tmp/")
        else []
    )
    assert sorted(listing) == sorted(["k8s-webhook-server", *kept])
    assert tmp_mode == "700"
    assert upstream_top.exists() == was_there  # nothing of it on the host
    with_pod = cluster.private_mounts(["true"], pod_files=tmp_path / "sa")
    assert with_pod[-3:] == [str(folder), str(tmp_path / "sa"), "true"]
    assert "secrets/kubernetes.io/serviceaccount" in with_pod[with_pod.index("-c") + 1]
