"""The controller's /metrics on the real control plane: HTTPS, every scrape's token checked by
the API server (TokenReview), then its user's grant (SubjectAccessReview for get /metrics),
under the chart's RBAC: the controller's `-metrics-auth` ClusterRole lets it ask, the
`-metrics-reader` ClusterRole lets a scraper in.

The controller runs on the host with the Deployment's args (--metrics-secure by default) as
the chart's ServiceAccount (the `controller` fixture).
"""

from __future__ import annotations

import urllib.error

import pytest
from e2e_helpers import CONTROLLER_USER, OPERATOR_RELEASE, apply_objects, namespace

NS = "metrics-auth-e2e"
READER_ROLE = f"{OPERATOR_RELEASE}-metrics-reader"


def token(kube, account: str) -> str:
    return kube.kubectl("create", "token", account, "-n", NS, "--duration=1h").stdout.strip()


@pytest.fixture(scope="module")
def accounts(kube, controller):
    """Two ServiceAccounts: `scraper`, bound to the chart's metrics-reader ClusterRole (as
    Prometheus's would be), and `stranger`, a valid identity without that grant."""
    namespace(kube, NS)
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": n, "namespace": NS}}
        for n in ("scraper", "stranger")
    ]
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{NS}-scraper"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": READER_ROLE,
        },
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": NS}],
    }
    apply_objects(kube, *objects, binding)
    yield {name: token(kube, name) for name in ("scraper", "stranger")}
    kube.kubectl("delete", "clusterrolebinding", f"{NS}-scraper", "--ignore-not-found")


def refused(controller, bearer: str | None) -> int:
    with pytest.raises(urllib.error.HTTPError) as err:
        controller.metrics(bearer)
    return err.value.code


def test_the_deployment_serves_metrics_securely(controller) -> None:
    assert "--metrics-secure" in controller.deployment_args()
    assert controller.metrics_scheme == "https"


def test_no_token_or_a_forged_one_is_401(controller, accounts) -> None:
    assert refused(controller, None) == 401
    assert refused(controller, "not-a-token") == 401
    # A real token with one character of its signature changed is no longer valid either (not
    # the last character: its low bits are base64 padding, so changing it may change nothing).
    real = accounts["scraper"]
    forged = real[:-20] + ("A" if real[-20] != "A" else "B") + real[-19:]
    assert refused(controller, forged) == 401


def test_a_valid_token_without_the_grant_is_403(controller, accounts) -> None:
    assert refused(controller, accounts["stranger"]) == 403


def test_a_service_account_bound_to_metrics_reader_gets_the_metrics(
    kube, controller, accounts
) -> None:
    text = controller.metrics(accounts["scraper"])
    assert "megdet_controller_reconcile_duration_seconds_count" in text
    assert "# TYPE megdet_controller_runs gauge" in text
    # The controller asked the API server with its own ServiceAccount, allowed by the chart.
    reviews = [
        (e["objectRef"]["resource"], e["responseStatus"].get("code"))
        for e in kube.audit_events(CONTROLLER_USER)
        if e.get("stage") == "ResponseComplete"
        and (e.get("objectRef") or {}).get("resource") in ("tokenreviews", "subjectaccessreviews")
    ]
    assert ("tokenreviews", 201) in reviews and ("subjectaccessreviews", 201) in reviews
    assert all(code == 201 for _, code in reviews), reviews


def test_the_grant_is_what_decides(kube, controller, accounts) -> None:
    # The same stranger, once bound to the reader role, gets in (a denial is cached 10 s at
    # most, so poll).
    from e2e_helpers import eventually

    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",  # a RoleBinding cannot grant a non-resource URL: still 403
        "metadata": {"name": "stranger-reader", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": READER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": "stranger", "namespace": NS}],
    }  # fmt: skip
    apply_objects(kube, binding)
    assert refused(controller, accounts["stranger"]) == 403
    cluster_binding = {**binding, "kind": "ClusterRoleBinding",
                       "metadata": {"name": f"{NS}-stranger"}}  # fmt: skip
    apply_objects(kube, cluster_binding)
    try:
        eventually(
            lambda: "megdet_controller_runs" in controller.metrics(accounts["stranger"]),
            timeout=30,
            message="stranger let in after a ClusterRoleBinding",
        )
    finally:
        kube.kubectl("delete", "clusterrolebinding", f"{NS}-stranger", "--ignore-not-found")
