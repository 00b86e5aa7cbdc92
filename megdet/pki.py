"""X.509 building blocks: keys, names, key usages, subject alternative names and certificates
signed by a given key, in PEM.

Two callers make certificates with these, each keeping its own choices: the local control
plane's PKI (``cluster/pki.py``: RSA 2048 keys in PKCS#1, one-year certificates on disk) and the
controller's TLS (``controller/tls.py``: EC P-256 keys in PKCS#8, in memory). Needs
``cryptography`` (the ``[controller]`` extra): the training image has none and makes no
certificate.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import Any

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # the training image: nothing there makes certificates
    raise ImportError("megdet.pki needs cryptography: pip install 'megdet[controller]'") from None

__all__ = [
    "Extension",
    "alt_names",
    "basic_constraints",
    "cert_pem",
    "certificate",
    "ec_key",
    "extended_usage",
    "key_pem",
    "key_usage",
    "name",
    "rsa_key",
]

#: An extension of a certificate and whether it is critical.
Extension = tuple[x509.ExtensionType, bool]


def rsa_key(bits: int = 2048) -> rsa.RSAPrivateKey:
    """A fresh RSA key (public exponent 65537)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


def ec_key() -> ec.EllipticCurvePrivateKey:
    """A fresh EC key on P-256."""
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: Any, *, pkcs1: bool = False) -> bytes:
    """``key``, unencrypted, in PEM: PKCS#8 ("PRIVATE KEY"), or with ``pkcs1`` OpenSSL's
    traditional form ("RSA PRIVATE KEY" for an RSA key, which is PKCS#1)."""
    form = (
        serialization.PrivateFormat.TraditionalOpenSSL
        if pkcs1
        else serialization.PrivateFormat.PKCS8
    )
    return key.private_bytes(serialization.Encoding.PEM, form, serialization.NoEncryption())


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def name(common_name: str, orgs: Sequence[str] = ()) -> x509.Name:
    """A subject: its organizations (O), then its common name (CN)."""
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def basic_constraints(*, ca: bool, path_length: int | None = None) -> Extension:
    """Whether the certificate is a CA (and how many CAs may follow it), critical."""
    return x509.BasicConstraints(ca=ca, path_length=path_length), True


def key_usage(*, ca: bool, key_encipherment: bool) -> Extension:
    """Digital signature; key encipherment where asked (TLS key exchange with an RSA key); for a
    CA, signing certificates and CRLs. Critical."""
    usage = x509.KeyUsage(
        digital_signature=True, key_encipherment=key_encipherment, key_cert_sign=ca,
        crl_sign=ca, content_commitment=False, data_encipherment=False, key_agreement=False,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    return usage, True


def extended_usage(*, server: bool = False, client: bool = False) -> Extension:
    """TLS server and/or client authentication, not critical."""
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    return x509.ExtendedKeyUsage(usages), False


def alt_names(names: Iterable[x509.GeneralName]) -> Extension:
    """Subject alternative names, not critical."""
    return x509.SubjectAlternativeName(list(names)), False


def certificate(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: Any,
    signer: Any,
    validity: datetime.timedelta,
    extensions: Iterable[Extension],
) -> x509.Certificate:
    """The certificate of ``public_key`` for ``subject`` with ``extensions`` (in that order),
    signed with SHA-256 by ``signer`` (the issuer's private key) as ``issuer``, with a random
    serial, valid from five minutes ago (clocks differ) for ``validity``."""
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + validity)
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())
