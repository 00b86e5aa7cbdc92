"""What the cluster hands the operators' certificate rotators and the API server for JobSet,
Trainer v2 and Kueue, without starting anything: the project's webhook certificates pass the
rotators' checks (open-policy-agent/cert-controller v0.16.0 rotator.go ValidCert: the CA
against its CAName as a DNS name, the serving certificate against <service>.<namespace>.svc),
an older cache is re-signed without invalidating caBundles already handed out, and upstream's
webhook manifests become configurations pointed at this host. tests/e2e runs them for real."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from cluster import build
from cluster.control_plane import Cluster
from cluster.operators import (
    JOBSET_WEBHOOK_CONFIGS,
    KUEUE_WEBHOOK_CONFIGS,
    TRAINER_WEBHOOK_CONFIGS,
    WEBHOOK_CA_NAMES,
    WEBHOOK_SERVICE_NAMES,
    kueue_hook_kept,
)
from cluster.pki import CertificateAuthority, dns_names


def load(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def verifies(ca: x509.Certificate, leaf: x509.Certificate, name: str) -> bool:
    """What Go's x509 Verify checks here: the issuer's name and signature, the validity, and
    the name among the DNS SANs (cryptography's own verifier also demands key identifiers,
    which Go's does not; the project's certificates carry none)."""
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, InvalidSignature):
        return False
    now = datetime.datetime.now(datetime.UTC)
    return leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc and name in dns_names(leaf)


def test_the_webhook_pki_passes_every_rotators_checks(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEGDET_CLUSTER_CACHE", str(tmp_path))
    folder = Cluster.webhook_pki()
    ca, leaf = load(folder / "ca.crt"), load(folder / "webhook.crt")
    assert set(WEBHOOK_CA_NAMES) <= set(dns_names(ca))
    for name in WEBHOOK_SERVICE_NAMES:
        assert verifies(ca, leaf, name), name
    # Unchanged on a second call: every cluster on the machine serves the same files.
    assert Cluster.webhook_pki() == folder and load(folder / "webhook.crt") == leaf


def test_an_older_cache_is_re_signed_with_the_same_key(tmp_path, monkeypatch) -> None:
    """A cache from before JobSet, Trainer and Kueue: the CA gains their names and a new
    serving certificate is issued, and old and new verify against each other's CA (clusters
    still running keep their caBundle while the shared serving-certs folder changes)."""
    monkeypatch.setenv("MEGDET_CLUSTER_CACHE", str(tmp_path))
    folder = build.cache_dir() / "webhook-pki"
    old_ca = CertificateAuthority(folder, names=WEBHOOK_CA_NAMES[:2])
    old_dns = ["localhost", WEBHOOK_SERVICE_NAMES[0]]
    old_ca.issue("webhook", "megdet-webhooks", server=True, ips=["127.0.0.1"], dns=old_dns)
    old_leaf = load(folder / "webhook.crt")
    key = (folder / "ca.key").read_bytes()

    Cluster.webhook_pki()
    new_ca, new_leaf = load(folder / "ca.crt"), load(folder / "webhook.crt")
    assert (folder / "ca.key").read_bytes() == key
    assert set(WEBHOOK_CA_NAMES) <= set(dns_names(new_ca))
    assert new_leaf != old_leaf
    assert verifies(old_ca.cert, new_leaf, WEBHOOK_SERVICE_NAMES[-1])
    assert verifies(new_ca, old_leaf, WEBHOOK_SERVICE_NAMES[0])


def test_json_patch_does_what_the_kustomize_patches_need() -> None:
    doc = {"metadata": {"name": "a"}, "webhooks": [{"name": "x"}, {"name": "y"}]}
    Cluster.json_patch(
        doc,
        [
            {"op": "replace", "path": "/metadata/name", "value": "b"},
            {"op": "add", "path": "/webhooks/0/objectSelector", "value": {"k": 1}},
            {"op": "replace", "path": "/webhooks/1", "value": {"name": "z"}},
            {"op": "add", "path": "/webhooks/-", "value": {"name": "w"}},
            {"op": "remove", "path": "/webhooks/2"},
        ],
    )
    assert doc == {
        "metadata": {"name": "b"},
        "webhooks": [{"name": "x", "objectSelector": {"k": 1}}, {"name": "z"}],
    }


def module_or_skip(pin: str):
    try:
        path = build.module_source(pin)
    except Exception as err:  # no Go module cache here: tests/e2e covers it where there is
        pytest.skip(f"{pin}'s module source is not available: {err}")
    if not path.is_dir():
        pytest.skip(f"{pin}'s module source is not in Go's module cache")
    return path


def hooks(configs) -> dict[str, dict]:
    return {h["name"]: h for c in configs for h in c["webhooks"]}


def test_upstream_webhooks_are_pointed_at_this_host(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEGDET_CLUSTER_CACHE", str(tmp_path))
    cluster = Cluster(root=tmp_path / "c")
    module_or_skip("jobset")
    configs = cluster.patched_webhook_configurations("jobset", 9, JOBSET_WEBHOOK_CONFIGS)
    assert {c["metadata"]["name"] for c in configs} == set(JOBSET_WEBHOOK_CONFIGS.values())
    found = hooks(configs)
    assert found["mjobset.kb.io"]["clientConfig"]["url"] == (
        "https://127.0.0.1:9/mutate-jobset-x-k8s-io-v1alpha2-jobset"
    )
    # Only a JobSet's pods go through JobSet's pod hooks (failurePolicy Fail).
    for name in ("mpod.kb.io", "vpod.kb.io"):
        selector = found[name]["objectSelector"]["matchExpressions"]
        assert selector == [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]

    module_or_skip("trainer")
    configs = cluster.patched_webhook_configurations("trainer", 9, TRAINER_WEBHOOK_CONFIGS)
    assert {c["metadata"]["name"] for c in configs} == set(TRAINER_WEBHOOK_CONFIGS.values())
    assert set(hooks(configs)) == {
        "defaulter.trainjob.trainer.kubeflow.org",
        "validator.clustertrainingruntime.trainer.kubeflow.org",
        "validator.trainingruntime.trainer.kubeflow.org",
        "validator.trainjob.trainer.kubeflow.org",
    }

    kueue = module_or_skip("kueue") / "config/components/webhook"
    configs = cluster.webhook_configurations(
        kueue / "manifests.yaml",
        9,
        KUEUE_WEBHOOK_CONFIGS,
        keep=kueue_hook_kept,
    )
    # Both targets' hooks (KUEUE_FRAMEWORKS), none of the kinds Kueue runs no integration for.
    for kind in ("trainjob", "pytorchjob"):
        assert {f"m{kind}.kb.io", f"v{kind}.kb.io"} <= set(hooks(configs))
    for kind in ("pod", "tfjob", "jaxjob", "job"):
        assert f"m{kind}.kb.io" not in hooks(configs)
