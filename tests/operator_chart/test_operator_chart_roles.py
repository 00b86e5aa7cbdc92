"""The chart's RBAC beyond the controller's run rules (real Helm engine):

* megdet-edit / megdet-view, aggregated into the built-in admin/edit and view ClusterRoles
  (rbac.aggregateToDefaultRoles), without megdetruns/privileged;
* /metrics behind authentication (metrics.secure): the controller's TokenReview and
  SubjectAccessReview rights, the scrapers' metrics-reader role, the Deployment's flags and
  certificate volume, and the ServiceMonitor's HTTPS scrape with Prometheus's token.

tests/e2e/test_e2e_user_roles.py and tests/e2e/test_e2e_metrics_auth.py check the same on a real API
server.
"""

from __future__ import annotations

import pytest
from operator_chart_helpers import CI_VALUES, NAMESPACE, RELEASE, render, render_error, values_file

from megdet.cli import build_parser

AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def assert_granted_to_the_controller(rendered, role: dict) -> None:
    """The ClusterRoleBinding of ``role``'s name binds it to the controller's ServiceAccount."""
    rendered.assert_granted(rendered.named("ClusterRoleBinding", role["metadata"]["name"]), role)


def rules(role: dict) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule.get("apiGroups", []):
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
        for url in rule.get("nonResourceURLs", []):
            out.setdefault(("nonResourceURL", url), set()).update(rule["verbs"])
    return out


def aggregation(role: dict) -> set[str]:
    labels = role["metadata"]["labels"]
    return {
        k[len(AGGREGATE) :] for k, v in labels.items() if k.startswith(AGGREGATE) and v == "true"
    }


def test_edit_and_view_roles_aggregate_into_the_builtin_roles() -> None:
    rendered = render()
    edit = rendered.named("ClusterRole", "megdet-edit")
    view = rendered.named("ClusterRole", "megdet-view")
    assert aggregation(edit) == {"admin", "edit"}
    assert aggregation(view) == {"view"}
    assert rules(edit) == {
        ("megdet.io", "megdetruns"): {
            "create",
            "update",
            "patch",
            "delete",
            "get",
            "list",
            "watch",
        },
        ("megdet.io", "megdetruns/status"): {"get", "list", "watch"},
    }
    assert rules(view) == {
        ("megdet.io", "megdetruns"): {"get", "list", "watch"},
        ("megdet.io", "megdetruns/status"): {"get", "list", "watch"},
    }
    # No aggregationRule of their own, no binding: the built-in roles are bound per namespace.
    assert "aggregationRule" not in edit and "aggregationRule" not in view
    bound = {b["roleRef"]["name"] for b in rendered.of_kind("ClusterRoleBinding")}
    assert not bound & {"megdet-edit", "megdet-view"}


def test_user_roles_never_grant_the_privileged_subresource_or_wildcards() -> None:
    rendered = render()
    for name in ("megdet-edit", "megdet-view"):
        for (group, resource), verbs in rules(rendered.named("ClusterRole", name)).items():
            assert resource != "megdetruns/privileged" and "use" not in verbs
            assert "*" not in group + resource and "*" not in verbs


@pytest.mark.parametrize(
    "values",
    [{"rbac": {"aggregateToDefaultRoles": False}}, {"rbac": {"create": False}}],
    ids=["aggregateToDefaultRoles=false", "create=false"],
)
def test_user_roles_can_be_left_out(values) -> None:
    names = {r["metadata"]["name"] for r in render(values).of_kind("ClusterRole")}
    assert not names & {"megdet-edit", "megdet-view"}


def test_user_roles_ship_with_watch_namespaces_too() -> None:
    rendered = render(values_file(next(p for p in CI_VALUES if "single" in p.name)))
    names = {r["metadata"]["name"] for r in rendered.of_kind("ClusterRole")}
    assert {"megdet-edit", "megdet-view"} <= names


# --- metrics.secure ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values", [{}, {"controller": {"watchNamespaces": ["vision"]}}], ids=["all", "watchNamespaces"]
)
def test_secure_metrics_give_the_controller_review_rights_cluster_wide(values) -> None:
    rendered = render(values)
    role = rendered.named("ClusterRole", f"{RELEASE}-metrics-auth")
    assert rules(role) == {
        ("authentication.k8s.io", "tokenreviews"): {"create"},
        ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
    }
    assert_granted_to_the_controller(rendered, role)
    reader = rendered.named("ClusterRole", f"{RELEASE}-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_secure_is_the_default_and_the_args_parse() -> None:
    (container,) = render().one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--metrics-secure" in container["args"]
    args = build_parser().parse_args(container["args"])
    assert args.metrics_secure is True and args.metrics_cert_dir is None
    pod = render().one("Deployment")["spec"]["template"]["spec"]
    assert "metrics-certs" not in {v["name"] for v in pod["volumes"]}  # nothing mounted


def test_insecure_metrics_drop_the_review_rights_and_say_so_in_the_args() -> None:
    rendered = render({"metrics": {"secure": False}, "serviceMonitor": {"enabled": True}})
    names = {r["metadata"]["name"] for r in rendered.of_kind("ClusterRole")}
    assert not names & {f"{RELEASE}-metrics-auth", f"{RELEASE}-metrics-reader"}
    assert f"{RELEASE}-metrics-auth" not in {
        b["metadata"]["name"] for b in rendered.of_kind("ClusterRoleBinding")
    }
    (container,) = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert build_parser().parse_args(container["args"]).metrics_secure is False
    (endpoint,) = rendered.one("ServiceMonitor")["spec"]["endpoints"]
    assert not {"scheme", "bearerTokenFile", "tlsConfig"} & set(endpoint)


def test_cert_secret_is_mounted_and_passed_as_the_cert_dir() -> None:
    rendered = render({"metrics": {"certSecret": "controller-metrics-tls"}})
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["args"])
    (volume,) = [v for v in pod["volumes"] if v["name"] == "metrics-certs"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "metrics-certs"]
    assert volume["secret"]["secretName"] == "controller-metrics-tls"
    assert {i["path"] for i in volume["secret"]["items"]} == {"tls.crt", "tls.key"}
    assert mount["readOnly"] is True and args.metrics_cert_dir == mount["mountPath"]


def test_service_monitor_scrapes_https_with_prometheus_token() -> None:
    rendered = render({"serviceMonitor": {"enabled": True}})
    (endpoint,) = rendered.one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True


def test_service_monitor_verifies_the_server_with_a_given_ca() -> None:
    rendered = render(
        {
            "serviceMonitor": {"enabled": True},
            "metrics": {"certSecret": "tls", "caSecret": "metrics-ca", "caSecretKey": "ca.pem"},
        }
    )
    (endpoint,) = rendered.one("ServiceMonitor")["spec"]["endpoints"]
    service = rendered.named("Service", "megdet-operator-metrics")["metadata"]["name"]
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "metrics-ca", "key": "ca.pem"}},
        "serverName": f"{service}.{NAMESPACE}.svc",
    }


def test_pod_monitor_still_scrapes_trainers_over_plain_http() -> None:
    # The trainers' exporters are not the controller's: they stay plain HTTP.
    (pm,) = render({"podMonitor": {"enabled": True}}).of_kind("PodMonitor")
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert "scheme" not in endpoint and "tlsConfig" not in endpoint


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"metrics": {"secure": False, "certSecret": "x"}},
            "metrics.certSecret and metrics.caSecret need metrics.secure=true",
        ),
        ({"metrics": {"secure": "yes"}}, "at '/metrics/secure': got string, want boolean"),
        ({"rbac": {"aggregateToDefaultRoles": 1}}, "/rbac/aggregateToDefaultRoles"),
        ({"metrics": {"certSecret": "Not_A_Name"}}, "/metrics/certSecret"),
    ],
)
def test_bad_values_are_refused_naming_the_value(values, message) -> None:
    assert message in render_error(values)


def test_metrics_role_names_fit_and_stay_distinct_for_a_long_release() -> None:
    rendered = render(release="a-very-long-release-name-for-the-platform-teams-cluster-operator-x")
    main = rendered.one("Deployment")["metadata"]["name"]  # the fullname, truncated
    names = [main] + [
        r["metadata"]["name"]
        for r in rendered.of_kind("ClusterRole")
        if r["metadata"]["name"].endswith(("-metrics-auth", "-metrics-reader"))
    ]
    assert len(names) == len(set(names)) == 3 and all(len(n) <= 63 for n in names), names


# --- controller.progressEnabled ---------------------------------------------------------------


@pytest.mark.parametrize(
    "values", [{}, {"controller": {"watchNamespaces": ["vision"]}}], ids=["all", "watchNamespaces"]
)
def test_progress_gives_the_controller_the_issuer_discovery_urls_and_no_token_reviews(values):
    """The endpoint verifies the pods' tokens with the issuer's keys (progress_auth.py): get on
    the discovery document and the JWKS, cluster-wide (non-resource URLs), bound to the
    controller's ServiceAccount; no TokenReview right for it."""
    rendered = render({**values, "metrics": {"secure": False}})
    role = rendered.named("ClusterRole", f"{RELEASE}-progress")
    assert rules(role) == {
        ("nonResourceURL", "/.well-known/openid-configuration"): {"get"},
        ("nonResourceURL", "/openid/v1/jwks"): {"get"},
    }
    assert_granted_to_the_controller(rendered, role)
    docs = rendered.of_kind("ClusterRole") + rendered.of_kind("Role")
    granted = {key for doc in docs for key in rules(doc)}
    assert ("authentication.k8s.io", "tokenreviews") not in granted
