"""The controller's TLS serving certificates: self-signed ones made at start, or mounted ones.

Both of its HTTPS servers use this: ``/metrics`` (:mod:`megdet.controller.metrics_auth`, a
self-signed certificate as controller-runtime's secure metrics serving makes) and the progress
endpoint (:mod:`megdet.controller.progress_ca`, a CA of its own that the run's pods verify).
A mounted folder holds a kubernetes.io/tls Secret's keys (``tls.crt``, ``tls.key``; cert-manager
adds ``ca.crt``). Keys are EC P-256.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "CERT_NAME",
    "KEY_NAME",
    "ca_and_serving_cert",
    "context_from_dir",
    "context_from_pem",
    "self_signed",
]

#: The file names in a certificate folder (a kubernetes.io/tls Secret's keys).
CERT_NAME = "tls.crt"
KEY_NAME = "tls.key"


def _server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def context_from_dir(cert_dir: str | Path) -> ssl.SSLContext:
    """A TLS 1.2+ server context from ``cert_dir``'s ``tls.crt`` and ``tls.key``.

    Raises ValueError naming the missing or unreadable file.
    """
    cert, key = Path(cert_dir) / CERT_NAME, Path(cert_dir) / KEY_NAME
    for path in (cert, key):
        if not path.is_file():
            raise ValueError(f"{path} does not exist (needs {CERT_NAME} and {KEY_NAME})")
    context = _server_context()
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as err:
        raise ValueError(f"cannot load {cert} / {key}: {err}") from None
    return context


def context_from_pem(chain_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """A TLS 1.2+ server context for a certificate chain and key held in memory.

    ssl loads key pairs from files only: they are written where the pod may write (/tmp, the
    key readable by the owner only), loaded, and removed at once.
    """
    context = _server_context()
    with tempfile.TemporaryDirectory(prefix="megdet-tls-") as tmp:
        cert_file, key_file = os.path.join(tmp, CERT_NAME), os.path.join(tmp, KEY_NAME)
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(key_pem)
        Path(cert_file).write_bytes(chain_pem)
        context.load_cert_chain(cert_file, key_file)
    return context


def _key_usage(*, cert_sign: bool) -> Any:
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=True, key_encipherment=False, content_commitment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign,
        crl_sign=cert_sign, encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _subject_names(hosts: Iterable[str]) -> list[Any]:
    """DNS and IP subject alternative names for ``hosts``, in order, without repeats."""
    from cryptography import x509

    names: list[x509.GeneralName] = []
    for host in hosts:
        if not host:
            continue
        try:
            entry: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            entry = x509.DNSName(host)
        if entry not in names:
            names.append(entry)
    return names


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _certificate(subject: Any, issuer: Any, public_key: Any, days: int) -> Any:
    """A certificate builder for ``subject`` signed by ``issuer``, valid from five minutes ago
    (clocks differ) for ``days`` days, with a random serial."""
    from cryptography import x509

    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _serving(builder: Any, hosts: list[str]) -> Any:
    """``builder`` as a serving (not CA) certificate for ``hosts``, ``localhost`` and
    127.0.0.1."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    return (
        builder.add_extension(
            x509.SubjectAlternativeName(_subject_names([*hosts, "localhost", "127.0.0.1"])),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )


def self_signed(hostname: str) -> tuple[bytes, bytes]:
    """A fresh EC P-256 key and a one-year self-signed certificate for ``hostname``,
    ``localhost`` and 127.0.0.1 (PEM: certificate, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{hostname}@{int(time.time())}")])
    hosts = [hostname] if hostname and hostname != "localhost" else []
    cert = (
        _serving(_certificate(name, name, key.public_key(), 365), hosts)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def ca_and_serving_cert(hosts: list[str], ca_name: str, leaf_name: str) -> tuple[bytes, ...]:
    """A fresh ten-year CA (common name ``ca_name@<time>``) and a serving certificate
    (``leaf_name``) it signs for ``hosts``, ``localhost`` and 127.0.0.1 (PEM: CA certificate,
    serving certificate, serving key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_key = ec.generate_private_key(ec.SECP256R1())
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{ca_name}@{int(time.time())}")])
    ca = (
        _certificate(issuer, issuer, ca_key.public_key(), 3650)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, leaf_name)])
    leaf = (
        _serving(_certificate(subject, issuer, key.public_key(), 3650), hosts)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return ca.public_bytes(pem), leaf.public_bytes(pem), _key_pem(key)
