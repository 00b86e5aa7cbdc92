"""The controller's TLS serving certificates (EC P-256): self-signed ones made at start, or the
``tls.crt``/``tls.key`` of a mounted kubernetes.io/tls Secret. docs/monitoring.md, "Metrics
authentication", and docs/controller.md, "Progress reporting in detail" (TLS).
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

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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
    """A TLS 1.2+ server context for a certificate chain and key held in memory."""
    context = _server_context()
    with tempfile.TemporaryDirectory(prefix="megdet-tls-") as tmp:
        cert_file, key_file = os.path.join(tmp, CERT_NAME), os.path.join(tmp, KEY_NAME)
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(key_pem)
        Path(cert_file).write_bytes(chain_pem)
        context.load_cert_chain(cert_file, key_file)
    return context


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, key_encipherment=False, content_commitment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign,
        crl_sign=cert_sign, encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _subject_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """DNS and IP subject alternative names for ``hosts``, in order, without repeats."""
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


def _serving(hosts: list[str]) -> list[tuple[Any, bool]]:
    """The (extension, critical) pairs of a serving certificate for ``hosts`` and localhost."""
    return [
        (x509.SubjectAlternativeName(_subject_names([*hosts, "localhost", "127.0.0.1"])), False),
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
    ]


def _sign(
    subject: x509.Name,
    issuer: x509.Name,
    key: Any,
    signer: Any,
    days: int,
    extensions: list[tuple[Any, bool]],
) -> bytes:
    """The PEM certificate of ``key`` for ``subject``, signed by ``signer`` as ``issuer``,
    valid from five minutes ago (clocks differ) for ``days`` days, with a random serial."""
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _key_pem(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def self_signed(hostname: str) -> tuple[bytes, bytes]:
    """A fresh EC P-256 key and a one-year self-signed certificate for ``hostname``,
    ``localhost`` and 127.0.0.1 (PEM: certificate, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(f"{hostname}@{int(time.time())}")
    hosts = [hostname] if hostname and hostname != "localhost" else []
    extensions = [*_serving(hosts), (_key_usage(cert_sign=False), True)]
    return _sign(name, name, key, key, 365, extensions), _key_pem(key)


def ca_and_serving_cert(hosts: list[str], ca_name: str, leaf_name: str) -> tuple[bytes, ...]:
    """A fresh ten-year CA (common name ``ca_name@<time>``) and a serving certificate
    (``leaf_name``) it signs for ``hosts``, ``localhost`` and 127.0.0.1 (PEM: CA certificate,
    serving certificate, serving key)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    issuer = _name(f"{ca_name}@{int(time.time())}")
    ca = _sign(issuer, issuer, ca_key, ca_key, 3650, [
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (_key_usage(cert_sign=True), True),
        (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False),
    ])  # fmt: skip
    leaf = _sign(_name(leaf_name), issuer, key, ca_key, 3650, [
        *_serving(hosts),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
    ])  # fmt: skip
    return ca, leaf, _key_pem(key)
