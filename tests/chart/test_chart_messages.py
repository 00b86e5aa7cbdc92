"""The run chart's rule messages: generated from megdet/messages.py (the one copy of each
rule's words), included by _plan.tpl with the values they show, rendered by the real Helm
engine; and Helm's values-schema check ignores the CEL keyword the schema carries for the CRD."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import helm_python
import pytest
import yaml
from chart_helpers import CHART_DIR, REPO

from megdet.messages import CHART_FILE, MESSAGES, chart_templates

PLACEHOLDER = re.compile(r"\{([A-Za-z][\w.]*)(?::(n|q|v|qv))?\}")
TOKEN = r'"[^"]*"|\((?:[^()]|\([^()]*\))*\)|[^\s()]+'
INCLUDE = re.compile(r'include "megdet\.msg\.(\w+)" \(dict((?:\s+(?:' + TOKEN + r"))*)\)")
CHART_RULES = [rule_id for rule_id, message in MESSAGES.items() if message.chart]


def names(rule_id: str) -> set[str]:
    """The values a rule's chart message shows (the dict its template takes)."""
    message = MESSAGES[rule_id]
    return {
        m.group(1) for m in PLACEHOLDER.finditer(message.text + message.tail) if m.group(2) != "n"
    }


def test_committed_message_templates_are_the_generated_ones():
    committed = (REPO / CHART_FILE).read_text()
    assert committed == chart_templates(), "stale chart messages: run `make messages`"


def test_every_chart_rule_is_included_with_exactly_its_values():
    templates = "".join(p.read_text() for p in sorted((CHART_DIR / "templates").glob("*.tpl")))
    calls: dict[str, set[str]] = {}
    for match in INCLUDE.finditer(templates):
        tokens = re.findall(TOKEN, match.group(2))
        keys = {json.loads(key) for key in tokens[::2]}
        calls.setdefault(match.group(1), set()).update(keys)
    assert sorted(calls) == sorted(CHART_RULES)
    for rule_id, keys in calls.items():
        assert keys == names(rule_id), rule_id


def test_plan_tpl_writes_no_message_of_its_own():
    # Every user-facing fail in _plan.tpl takes its text from a megdet.msg template.
    text = (CHART_DIR / "templates" / "_plan.tpl").read_text()
    own = [line for line in text.splitlines() if re.search(r"fail \(printf|fail \"", line)]
    assert own == [line for line in own if "owned-overrides.yaml is missing" in line]


def expected(rule_id: str, values: dict[str, str]) -> str:
    """The placeholder rules of megdet/messages.py's docstring, as Helm shows them."""
    message = MESSAGES[rule_id]

    def sub(m: re.Match[str]) -> str:
        name, flag = m.group(1), m.group(2) or ""
        if flag == "n":
            return name
        shown = json.dumps(values[name]) if "q" in flag else values[name]
        return shown if "v" in flag else f"{name}={shown}"

    return PLACEHOLDER.sub(sub, message.text + message.tail)


def test_helm_renders_each_message_as_written(tmp_path):
    chart = tmp_path / "msgs"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: msgs\nversion: 0.1.0\n")
    shutil.copy(REPO / CHART_FILE, chart / "templates" / "_messages.tpl")
    samples = {
        rule_id: {name: f'v{i}-"{name}" 50%' for i, name in enumerate(sorted(names(rule_id)))}
        for rule_id in CHART_RULES
    }
    lines = [
        f'{rule_id}: {{{{ include "megdet.msg.{rule_id}" .Values.{rule_id} | toJson }}}}'
        for rule_id in CHART_RULES
    ]
    (chart / "templates" / "out.yaml").write_text("\n".join(lines) + "\n")
    with helm_python.Chart.load(str(chart)) as loaded:
        files = loaded.render(values=samples, name="r", namespace="n", is_install=True)
    (text,) = [body for path, body in files.items() if path.endswith("out.yaml")]
    rendered = yaml.safe_load(text)
    for rule_id in CHART_RULES:
        assert rendered[rule_id] == expected(rule_id, samples[rule_id]), rule_id


# -- Helm and x-kubernetes-validations ---------------------------------------------------------

ALWAYS_FALSE = {"rule": "false", "message": "HELM-ENFORCED-A-CEL-RULE"}


@pytest.fixture
def cel_chart(tmp_path: Path) -> Path:
    """The run chart whose values schema has a rule that no value passes, at the root and on a
    field, and a malformed x-kubernetes-validations (not a list) on another."""
    chart = tmp_path / "megdet"
    shutil.copytree(CHART_DIR, chart)
    path = chart / "values.schema.json"
    schema = json.loads(path.read_text())
    schema["x-kubernetes-validations"] = [ALWAYS_FALSE]
    schema["properties"]["gpus"]["x-kubernetes-validations"] = [ALWAYS_FALSE]
    schema["properties"]["maxIter"]["x-kubernetes-validations"] = "not a list of rules"
    path.write_text(json.dumps(schema))
    return chart


def test_the_values_schema_carries_cel_rules():
    # What the Helm tests below guard: the run chart's schema does hold the keyword.
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert schema["x-kubernetes-validations"]
    assert schema["properties"]["gang"]["x-kubernetes-validations"]


def test_helm_engine_ignores_x_kubernetes_validations(cel_chart):
    with helm_python.Chart.load(str(cel_chart)) as chart:
        files = chart.render(values={}, name="r", namespace="n", is_install=True)
        assert any(path.endswith("pytorchjob.yaml") for path in files)
        # Still validating the schema's own keywords.
        with pytest.raises(helm_python.HelmError) as err:
            chart.render(values={"gpus": "x"}, name="r", namespace="n", is_install=True)
    assert "/gpus" in str(err.value)
    assert "HELM-ENFORCED" not in str(err.value)


def helm_cli() -> Path:
    from cluster.build import binary_path

    path = binary_path("helm")
    if not path.exists():
        pytest.skip(f"the pinned helm CLI is not built ({path}; make cluster-build)")
    return path


def test_helm_cli_ignores_x_kubernetes_validations(cel_chart):
    helm = helm_cli()
    base = [str(helm), "template", "r", str(cel_chart), "--kube-version", "1.30.0"]
    ok = subprocess.run(base, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "kind: PyTorchJob" in ok.stdout
    lint = subprocess.run(
        [str(helm), "lint", "--strict", str(cel_chart)], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    bad = subprocess.run([*base, "--set", "gpus=x"], capture_output=True, text=True)
    assert bad.returncode != 0 and "/gpus" in bad.stderr
    assert "HELM-ENFORCED" not in bad.stderr
