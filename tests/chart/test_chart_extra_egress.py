"""networkPolicy.extraEgress is checked as the API server checks a NetworkPolicyEgressRule, so a
rule that would make the run's NetworkPolicy invalid is refused in the values (Helm's render,
the controller's render) and in the MegDetRun (the CRD's schema and CEL rules, evaluated offline
here; tests/e2e/test_network_policy.py applies the CRD to the real API server), naming the
field and what it must look like."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from megdet.api.crd import build_crd
from megdet.api.schema import apply_defaults, cel_problems, schema_problems
from megdet.controller.problems import InvalidRunError
from megdet.controller.render import render_run


def values(*rules: Any) -> dict[str, Any]:
    return {"networkPolicy": {"enabled": True, "restrictEgress": True, "extraEgress": list(rules)}}


GOOD = [
    {"to": [{"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.5.0/24"]}}]},
    {"to": [{"ipBlock": {"cidr": "2001:db8::/64"}}], "ports": [{"port": 443}]},
    {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]},
    {"ports": [{"protocol": "UDP", "port": 8000, "endPort": 8100}]},
    {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "storage"}},
                "podSelector": {
                    "matchExpressions": [
                        {"key": "app", "operator": "In", "values": ["minio"]},
                        {"key": "tier", "operator": "Exists"},
                    ]
                },
            }
        ],
        "ports": [{"protocol": "TCP", "port": 9000}],
    },
]


@pytest.mark.parametrize("rule", GOOD, ids=["ipv4-except", "ipv6", "any", "range", "selectors"])
def test_valid_rules_render_into_a_valid_network_policy(render, rule):
    (policy,) = [o for o in render(values(rule)).objects if o["kind"] == "NetworkPolicy"]
    assert policy["spec"]["egress"][-1] == rule
    for version in ("1.27.0", "1.34.0"):
        kubernetes_validate.validate(policy, version, strict=True)
    spec = crd_spec()
    run = apply_defaults(spec, values(rule))
    assert schema_problems(spec, run) == [] and cel_problems(spec, run) == []


CIDR_WORDS = "must be an IPv4 or IPv6 CIDR: an address and a prefix length, e.g. 10.20.0.0/16"


@pytest.mark.parametrize(
    ("rule", "field", "helm_words", "crd_words"),
    [
        ({"to": [{"ipBlock": {"cidr": "10.20.0.0/33"}}]}, "to[0].ipBlock.cidr", CIDR_WORDS, None),
        ({"to": [{"ipBlock": {"cidr": "10.256.0.0/16"}}]}, "to[0].ipBlock.cidr", CIDR_WORDS, None),
        ({"to": [{"ipBlock": {"cidr": "10.20.0.0"}}]}, "to[0].ipBlock.cidr", CIDR_WORDS, None),
        ({"to": [{"ipBlock": {"cidr": "010.20.0.0/16"}}]}, "to[0].ipBlock.cidr", CIDR_WORDS, None),
        ({"to": [{"ipBlock": {"cidr": "2001:db8:::/64"}}]}, "to[0].ipBlock.cidr", CIDR_WORDS, None),
        ({"to": [{"ipBlock": {"cidr": "2001:db8::/129"}}]}, "to[0].ipBlock.cidr", CIDR_WORDS, None),
        (
            {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/99"]}}]},
            "to[0].ipBlock.except[0]",
            CIDR_WORDS,
            None,
        ),
        ({"to": [{"ipBlock": {}}]}, "to[0].ipBlock.cidr", "is required", None),
        ({"ports": [{"port": 0}]}, "ports[0].port", "want 1", "less than the minimum of 1"),
        (
            {"ports": [{"port": 65536}]},
            "ports[0].port",
            "want 65,535",
            "greater than the maximum of 65535",
        ),
        ({"ports": [{"port": "https"}]}, "ports[0].port", "want integer", "is not of type"),
        (
            {"ports": [{"protocol": "ICMP"}]},
            "ports[0].protocol",
            "must be one of 'TCP', 'UDP', 'SCTP'",
            "is not one of ['TCP', 'UDP', 'SCTP']",
        ),
        ({"to": [{"ipblock": {"cidr": "10.0.0.0/8"}}]}, "to[0].ipblock", "unknown field", None),
        ({"from": []}, "from", "unknown field", None),
        (
            {"to": [{"podSelector": {"matchLabels": {"app": "not a value"}}}]},
            "to[0].podSelector.matchLabels.app",
            "does not match pattern",
            "does not match",
        ),
    ],
    ids=[
        "prefix-33",
        "octet-256",
        "no-prefix",
        "leading-zero",
        "ipv6-triple-colon",
        "ipv6-prefix-129",
        "except",
        "no-cidr",
        "port-0",
        "port-65536",
        "named-port",
        "protocol",
        "typo",
        "ingress-field",
        "label-value",
    ],
)
def test_rules_the_api_server_would_refuse_are_refused_naming_the_field(
    rule, field, helm_words, crd_words
):
    path = f"spec.networkPolicy.extraEgress[0].{field}"
    # Helm's render of the run chart: helm install, and the controller's render of a run.
    with pytest.raises(InvalidRunError) as refused:
        render_run("r", "vision", {"gpus": 8, **values(rule)})
    problems = [(p.path, p.message) for p in refused.value.problems]
    assert any(where == path and helm_words in said for where, said in problems), problems
    # The MegDetRun: the CRD's schema and CEL rules, as the API server applies them.
    problems = [(p.path, p.message) for p in crd_problems(values(rule))]
    words = crd_words or helm_words
    assert any(where == path and words in said for where, said in problems), problems


@pytest.mark.parametrize(
    ("rule", "field", "words"),
    [
        ({"to": [{}]}, "to[0]", "needs an ipBlock, a podSelector or a namespaceSelector"),
        (
            {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]},
            "to[0].ipBlock",
            "ipBlock stands alone",
        ),
        ({"ports": [{"port": 9000, "endPort": 8000}]}, "ports[0].endPort", "at least port"),
        ({"ports": [{"endPort": 8000}]}, "ports[0].endPort", "endPort needs a port"),
        (
            {"to": [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}]},
            "to[0].podSelector.matchExpressions[0].values",
            "In and NotIn need at least one value",
        ),
        ({"to": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}, "to[0].ipBlock.cidr", CIDR_WORDS),
    ],
    ids=[
        "empty-peer",
        "ipblock-and-selector",
        "endport-below",
        "endport-alone",
        "in-no-values",
        "cidr",
    ],
)
def test_the_crds_cel_rules_refuse_what_no_json_schema_says(rule, field, words):
    """Cross-field rules (CEL), which Helm's JSON Schema cannot state: the API server refuses
    the MegDetRun at admission, and `megdet validate` offline, with these words."""
    problems = [p for p in crd_problems(values(rule)) if words in p.message]
    assert [p.path for p in problems] == [f"spec.networkPolicy.extraEgress[0].{field}"], problems


def crd_spec() -> dict[str, Any]:
    (version,) = build_crd()["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def crd_problems(spec_values: dict[str, Any]) -> list[Any]:
    spec = crd_spec()
    run = apply_defaults(spec, spec_values)
    return schema_problems(spec, run) + cel_problems(spec, run)
