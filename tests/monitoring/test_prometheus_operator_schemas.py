"""The rendered ServiceMonitor, PodMonitor and PrometheusRule against Prometheus Operator's CRDs.

kubernetes-validate has no schema for custom resources, so the structure of each CRD's spec
schema (prometheus-operator v0.93.0, see the files' $comment) sits in tests/schemas and is
checked with jsonschema, unknown fields refused as `kubectl apply --validate=strict` would.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from monitoring_helpers import OPERATOR_CHART, ROOT, of_kind, render_operator

from megdet.api.schema import to_json_schema

KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")


def spec_validator(kind: str) -> jsonschema.Draft7Validator:
    path = ROOT / "tests" / "schemas" / f"{kind.lower()}-monitoring.coreos.com-v1.structure.json"
    return jsonschema.Draft7Validator(to_json_schema(json.loads(path.read_text())["spec"]))


def ci_values() -> dict:
    import helm_python

    return helm_python.values_from_yaml(
        (OPERATOR_CHART / "ci" / "monitoring-values.yaml").read_text()
    )


@pytest.mark.parametrize("kind", KINDS)
def test_rendered_monitoring_objects_match_the_crd(kind):
    (obj,) = of_kind(render_operator(ci_values()), kind)
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    errors = [
        f"{list(e.absolute_path)}: {e.message}"
        for e in spec_validator(kind).iter_errors(obj["spec"])
    ]
    assert errors == []


def test_a_misspelt_field_is_refused():
    (pm,) = of_kind(render_operator(ci_values()), "PodMonitor")
    endpoint = pm["spec"]["podMetricsEndpoints"][0]
    endpoint["relabellings"] = endpoint.pop("relabelings")
    errors = list(spec_validator("PodMonitor").iter_errors(pm["spec"]))
    assert errors and "relabellings" in errors[0].message
