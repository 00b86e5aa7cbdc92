"""The cluster's certificates: the CA signs certificates, a leaf certificate does not; both sign
and encipher keys (TLS with RSA), critically."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509

from cluster.pki import CertificateAuthority


def usages(path: Path) -> tuple[bool, dict[str, bool]]:
    ext = x509.load_pem_x509_certificate(path.read_bytes()).extensions
    found = ext.get_extension_for_class(x509.KeyUsage)
    names = ("digital_signature", "key_encipherment", "key_cert_sign", "crl_sign")
    return found.critical, {n: getattr(found.value, n) for n in names}


def test_the_ca_signs_certificates_and_a_leaf_does_not(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path, names=["webhook-ca"])
    leaf, _ = ca.issue("leaf", "leaf", dns=["leaf.example"], server=True, client=True)
    both = {"digital_signature": True, "key_encipherment": True}
    assert usages(ca.cert_path) == (True, {**both, "key_cert_sign": True, "crl_sign": True})
    assert usages(leaf) == (True, {**both, "key_cert_sign": False, "crl_sign": False})
