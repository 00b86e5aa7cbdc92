"""megdet.pki, the certificate builder the test control plane (cluster/pki.py) and the
controller's TLS (controller/tls.py) share: every usage, name and limit a caller asks for is in
the certificate, with the criticality each has, and nothing else is."""

from __future__ import annotations

import datetime
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, NameOID

from megdet import pki

USAGES = ("digital_signature", "key_encipherment", "key_cert_sign", "crl_sign")
OTHER_USAGES = ("content_commitment", "data_encipherment", "key_agreement")


def usages(extension: pki.Extension) -> tuple[bool, set[str]]:
    usage, critical = extension
    assert isinstance(usage, x509.KeyUsage)
    assert not any(getattr(usage, n) for n in OTHER_USAGES)
    return critical, {n for n in USAGES if getattr(usage, n)}


def test_key_usages_for_a_ca_and_a_leaf_with_and_without_key_encipherment() -> None:
    signs = {"digital_signature"}
    assert usages(pki.key_usage(ca=False, key_encipherment=False)) == (True, signs)
    assert usages(pki.key_usage(ca=False, key_encipherment=True)) == (
        True,
        {*signs, "key_encipherment"},
    )
    assert usages(pki.key_usage(ca=True, key_encipherment=False)) == (
        True,
        {*signs, "key_cert_sign", "crl_sign"},
    )
    assert usages(pki.key_usage(ca=True, key_encipherment=True)) == (True, set(USAGES))


def test_extended_usages_are_the_ones_asked_for() -> None:
    server, client = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
    for kwargs, wanted in [
        ({"server": True}, [server]),
        ({"client": True}, [client]),
        ({"server": True, "client": True}, [server, client]),
    ]:
        usage, critical = pki.extended_usage(**kwargs)
        assert (list(usage), critical) == (wanted, False), kwargs


def test_basic_constraints_are_critical_and_keep_the_path_length() -> None:
    assert pki.basic_constraints(ca=False) == (x509.BasicConstraints(False, None), True)
    assert pki.basic_constraints(ca=True) == (x509.BasicConstraints(True, None), True)
    assert pki.basic_constraints(ca=True, path_length=0) == (x509.BasicConstraints(True, 0), True)


def test_a_name_lists_its_organizations_then_its_common_name() -> None:
    subject = pki.name("system:kube-scheduler", ["system:masters", "other"])
    assert [(a.oid, a.value) for a in subject] == [
        (NameOID.ORGANIZATION_NAME, "system:masters"),
        (NameOID.ORGANIZATION_NAME, "other"),
        (NameOID.COMMON_NAME, "system:kube-scheduler"),
    ]
    assert [(a.oid, a.value) for a in pki.name("ca")] == [(NameOID.COMMON_NAME, "ca")]


def test_keys_and_their_pem_forms() -> None:
    rsa_key, ec_key = pki.rsa_key(), pki.ec_key()
    assert isinstance(rsa_key, rsa.RSAPrivateKey) and rsa_key.key_size == 2048
    assert rsa_key.public_key().public_numbers().e == 65537
    assert isinstance(ec_key, ec.EllipticCurvePrivateKey)
    assert isinstance(ec_key.curve, ec.SECP256R1)
    assert pki.key_pem(rsa_key, pkcs1=True).startswith(b"-----BEGIN RSA PRIVATE KEY-----\n")
    assert pki.key_pem(rsa_key).startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert pki.key_pem(ec_key).startswith(b"-----BEGIN PRIVATE KEY-----\n")


def test_a_leaf_signed_by_a_ca_carries_every_extension_in_order() -> None:
    ca_key, key = pki.ec_key(), pki.rsa_key()
    issuer = pki.name("test-ca")
    year = datetime.timedelta(days=365)
    ca = pki.certificate(issuer, issuer, ca_key.public_key(), ca_key, 10 * year, [
        pki.basic_constraints(ca=True, path_length=0),
        pki.key_usage(ca=True, key_encipherment=False),
        pki.alt_names([x509.DNSName("test-ca")]),
    ])  # fmt: skip
    sans = [
        x509.DNSName("svc.ns.svc"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    leaf = pki.certificate(pki.name("leaf", ["group"]), issuer, key.public_key(), ca_key, year, [
        pki.basic_constraints(ca=False),
        pki.key_usage(ca=False, key_encipherment=True),
        pki.extended_usage(server=True, client=True),
        pki.alt_names(sans),
    ])  # fmt: skip
    after = datetime.datetime.now(datetime.UTC)
    # A PEM round trip: what a client reads is what was built.
    ca = x509.load_pem_x509_certificate(pki.cert_pem(ca))
    leaf = x509.load_pem_x509_certificate(pki.cert_pem(leaf))
    leaf.verify_directly_issued_by(ca)
    assert leaf.issuer == ca.subject == issuer
    assert leaf.subject == pki.name("leaf", ["group"])
    assert leaf.signature_hash_algorithm is not None
    assert leaf.signature_hash_algorithm.name == "sha256"
    assert leaf.public_key() == key.public_key()
    assert [(e.oid, e.critical) for e in leaf.extensions] == [
        (ExtensionOID.BASIC_CONSTRAINTS, True),
        (ExtensionOID.KEY_USAGE, True),
        (ExtensionOID.EXTENDED_KEY_USAGE, False),
        (ExtensionOID.SUBJECT_ALTERNATIVE_NAME, False),
    ]
    got = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(got) == sans
    assert list(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.CLIENT_AUTH,
    ]
    leaf_usage = leaf.extensions.get_extension_for_class(x509.KeyUsage)
    assert usages((leaf_usage.value, leaf_usage.critical)) == (
        True,
        {"digital_signature", "key_encipherment"},
    )
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    # Valid from five minutes before it was made (clocks differ) for the validity asked for.
    five = datetime.timedelta(minutes=5)
    assert before - five - datetime.timedelta(seconds=1) <= leaf.not_valid_before_utc
    assert leaf.not_valid_before_utc <= after - five
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == year + five
    assert ca.not_valid_after_utc - ca.not_valid_before_utc == 10 * year + five


def test_every_certificate_gets_its_own_random_serial() -> None:
    key = pki.ec_key()
    subject = pki.name("x")
    day = datetime.timedelta(days=1)
    serials = {
        pki.certificate(subject, subject, key.public_key(), key, day, []).serial_number
        for _ in range(4)
    }
    assert len(serials) == 4
