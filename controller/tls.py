"""The controller's TLS serving certificates (EC P-256, PKCS#8 keys, built with megdet.pki):
self-signed ones made at start, or the ``tls.crt``/``tls.key`` of a mounted kubernetes.io/tls
Secret. docs/monitoring.md, "Metrics authentication", and docs/controller.md, "Progress
reporting in detail" (TLS).
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

from cryptography import x509

from megdet import pki

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
_ONE_YEAR, _TEN_YEARS = datetime.timedelta(days=365), datetime.timedelta(days=3650)


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


def _serving(hosts: list[str]) -> list[pki.Extension]:
    """The extensions of a serving certificate for ``hosts`` and localhost."""
    return [
        pki.alt_names(_subject_names([*hosts, "localhost", "127.0.0.1"])),
        pki.basic_constraints(ca=False),
        pki.extended_usage(server=True),
    ]


def self_signed(hostname: str) -> tuple[bytes, bytes]:
    """A fresh EC P-256 key and a one-year self-signed certificate for ``hostname``,
    ``localhost`` and 127.0.0.1 (PEM: certificate, key)."""
    key = pki.ec_key()
    name = pki.name(f"{hostname}@{int(time.time())}")
    hosts = [hostname] if hostname and hostname != "localhost" else []
    extensions = [*_serving(hosts), pki.key_usage(ca=False, key_encipherment=False)]
    cert = pki.certificate(name, name, key.public_key(), key, _ONE_YEAR, extensions)
    return pki.cert_pem(cert), pki.key_pem(key)


def ca_and_serving_cert(hosts: list[str], ca_name: str, leaf_name: str) -> tuple[bytes, ...]:
    """A fresh ten-year CA (common name ``ca_name@<time>``) and a serving certificate
    (``leaf_name``) it signs for ``hosts``, ``localhost`` and 127.0.0.1 (PEM: CA certificate,
    serving certificate, serving key)."""
    ca_key, key = pki.ec_key(), pki.ec_key()
    issuer = pki.name(f"{ca_name}@{int(time.time())}")
    ca = pki.certificate(issuer, issuer, ca_key.public_key(), ca_key, _TEN_YEARS, [
        pki.basic_constraints(ca=True, path_length=0),
        pki.key_usage(ca=True, key_encipherment=False),
        (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False),
    ])  # fmt: skip
    leaf = pki.certificate(pki.name(leaf_name), issuer, key.public_key(), ca_key, _TEN_YEARS, [
        *_serving(hosts),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
    ])  # fmt: skip
    return pki.cert_pem(ca), pki.cert_pem(leaf), pki.key_pem(key)
