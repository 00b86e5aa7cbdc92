"""The control plane's certificates and keys, made by the project (no cfssl, no kubeadm).

One RSA 2048 certificate authority per cluster signs the API server's serving certificate,
one client certificate per component (CN is the user, O the groups, as the API server's x509
authenticator reads them), and the serving certificate of the operators' admission webhooks.
The ServiceAccount token signing key is RSA 2048 too (RS256, what every token verifier accepts).

Keys are RSA in PKCS#1 PEM ("RSA PRIVATE KEY"): the operators' certificate rotator
(open-policy-agent/cert-controller, rotator.go buildArtifactsFromSecret) parses the CA and
serving keys it finds in its Secret with ``x509.ParsePKCS1PrivateKey`` and replaces anything
else with certificates of its own.

The certificates are built with megdet.pki, which the controller's TLS (controller/tls.py)
shares; what is chosen here (RSA 2048, PKCS#1, one year, the usages) stays here.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from megdet import pki

VALIDITY = datetime.timedelta(days=365)
#: The subject of each cluster's main CA (the etcd CA has its own, see control_plane).
CA_NAME = "megdet-cluster-ca"


def private_dir(path: Path) -> Path:
    """``path`` as a folder only its owner can open (0700), made so if missing and narrowed if
    it was there already (a symlink, or another user's folder, is refused: OSError); its
    parents are made with the process's umask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    if path.is_symlink() or not path.is_dir():
        raise OSError(f"{path} is not a folder")
    if path.stat().st_uid != os.geteuid():
        raise OSError(f"{path} belongs to another user (uid {path.stat().st_uid})")
    path.chmod(0o700)
    return path


def write_private(path: Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` as a file only its owner can read (0600 from the first byte:
    a new file opened with O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600, then renamed over
    ``path``, so a symlink or an open file planted at ``path`` gets nothing)."""
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def _certificate(
    subject: x509.Name,
    issuer: x509.Name,
    key: rsa.RSAPrivateKey,
    signer: rsa.RSAPrivateKey,
    *,
    ca: bool,
    extensions: Sequence[pki.Extension],
) -> x509.Certificate:
    """The certificate of ``key`` for ``subject``, signed by ``signer`` as ``issuer``, valid
    for VALIDITY (megdet.pki.certificate: SHA-256, a random serial, from five minutes ago).
    Every certificate here starts with its basic constraints (CA or not) and its key usages:
    signing and key encipherment, and for a CA signing certificates and CRLs; then
    ``extensions``."""
    own = [pki.basic_constraints(ca=ca), pki.key_usage(ca=ca, key_encipherment=True)]
    return pki.certificate(subject, issuer, key.public_key(), signer, VALIDITY, [*own, *extensions])


def _ca_certificate(key: rsa.RSAPrivateKey, name: x509.Name, names: Sequence[str]):
    """A self-signed CA certificate for ``key``; ``names`` are its DNS SANs (cert-controller
    checks a CA it is given against its CAName as a DNS name)."""
    sans = pki.alt_names(x509.DNSName(n) for n in names)
    return _certificate(name, name, key, key, ca=True, extensions=[sans])


class CertificateAuthority:
    """A CA on disk (``ca.crt``/``ca.key`` in ``folder``) that issues leaf certificates there."""

    def __init__(self, folder: Path, names: Sequence[str] = (), cn: str = CA_NAME) -> None:
        self.folder = private_dir(folder)
        crt, key = folder / "ca.crt", folder / "ca.key"
        if crt.exists() and key.exists():
            self.cert = x509.load_pem_x509_certificate(crt.read_bytes())
            self.key = serialization.load_pem_private_key(key.read_bytes(), password=None)
            return
        self.key = pki.rsa_key()
        self.cert = _ca_certificate(self.key, pki.name(cn), names or ["megdet-ca"])
        write_private(key, pki.key_pem(self.key, pkcs1=True))
        crt.write_bytes(self.pem)

    def add_names(self, names: Sequence[str]) -> bool:
        """Re-sign the CA certificate with ``names`` among its DNS SANs, keeping its key and
        subject; False when it had them all. Certificates the old one signed still verify
        against the new one and the other way round (same issuer name and key, and neither
        carries key identifiers), so caBundles already handed out stay valid."""
        have = dns_names(self.cert)
        if all(n in have for n in names):
            return False
        wanted = [*have, *(n for n in names if n not in have)]
        self.cert = _ca_certificate(self.key, self.cert.subject, wanted)
        tmp = self.cert_path.with_suffix(".tmp")
        tmp.write_bytes(self.pem)
        tmp.replace(self.cert_path)
        return True

    @property
    def cert_path(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def pem(self) -> bytes:
        return pki.cert_pem(self.cert)

    def issue(
        self,
        name: str,
        cn: str,
        orgs: Sequence[str] = (),
        dns: Sequence[str] = (),
        ips: Sequence[str] = (),
        server: bool = False,
        client: bool = False,
    ) -> tuple[Path, Path]:
        """Write ``<name>.crt`` and ``<name>.key``; returns their paths."""
        key = pki.rsa_key()
        extensions = [pki.extended_usage(server=server, client=client)]
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            extensions.append(pki.alt_names(sans))
        cert = _certificate(
            pki.name(cn, orgs), self.cert.subject, key, self.key, ca=False, extensions=extensions
        )
        crt_path, key_path = self.folder / f"{name}.crt", self.folder / f"{name}.key"
        write_private(key_path, pki.key_pem(key, pkcs1=True))
        crt_path.write_bytes(pki.cert_pem(cert))
        return crt_path, key_path


def dns_names(cert: x509.Certificate) -> list[str]:
    """A certificate's DNS subject alternative names."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return sans.get_values_for_type(x509.DNSName)


def service_account_keys(folder: Path) -> tuple[Path, Path]:
    """The ServiceAccount token signing key pair: ``sa.key`` (private) and ``sa.pub``."""
    key = pki.rsa_key()
    private, public = folder / "sa.key", folder / "sa.pub"
    write_private(private, pki.key_pem(key, pkcs1=True))
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig(
    server: str,
    ca: Path,
    user: str,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
) -> str:
    """A self-contained kubeconfig (certificates embedded) for one user."""
    credentials: dict[str, str] = {}
    if cert and key:
        credentials = {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}
    if token:
        credentials = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "megdet",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca)},
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "megdet", "context": {"cluster": "megdet", "user": user}}],
        "current-context": "megdet",
    }
    return yaml.safe_dump(config, sort_keys=False)
