"""kube-score and kubeconform over what the charts render and the pods their jobs create
(docs/helm.md, "Linting what the controller creates").

Both tools are Go modules built from the module proxy at the versions pinned in pyproject.toml
(``[tool.megdet.cluster]`` kube_score, kubeconform) into the project's tool cache
(cluster.build; ``make test`` builds them before pytest). kubeconform reads JSON schemas
from a folder made here, offline:

* built-in kinds: kubernetes-validate's bundled strict schemas for Kubernetes
  :data:`K8S_VERSION` (the newest it bundles), each made standalone: the shared definitions it
  reaches copied into it (kubeconform would otherwise fetch ``/api/_definitions.json`` from
  kubernetes.io, and compile all of it for every kind);
* custom resources: each CRD's ``openAPIV3Schema`` as JSON Schema
  (megdet.api.schema.to_json_schema: unknown fields refused, as
  ``kubectl apply --validate=strict``): the CRDs the e2e cluster installs, from the pinned Go
  modules (Kubeflow training operator, Trainer), the operator chart's own ``crds/``, and the
  structure of Prometheus Operator's CRDs in tests/schemas.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from cluster import build
from megdet.api.schema import to_json_schema

REPO = Path(__file__).resolve().parents[2]
#: The newest Kubernetes kubernetes-validate bundles schemas for (kube-score: its minor).
K8S_VERSION = "1.34.0"
#: Where the accepted findings are listed, one table row each.
JUSTIFICATIONS = REPO / "docs" / "helm.md"
JUSTIFICATIONS_HEADING = "### Accepted findings"
#: CRDs of custom resources the charts render: (pinned Go module or None for this repo, path).
CRD_SOURCES = (
    ("training_operator", "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"),
    ("trainer", "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml"),
    ("trainer", "manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml"),
    *((None, str(p.relative_to(REPO))) for p in sorted(REPO.glob("charts/*/crds/*.yaml"))),
)
PROMETHEUS_STRUCTURES = sorted((REPO / "tests" / "schemas").glob("*.structure.json"))
DRAFT7 = "http://json-schema.org/draft-07/schema#"
#: libyaml's parser when PyYAML has it: Trainer's CRDs are megabytes of YAML.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def tool(binary: str) -> Path:
    """The pinned build of ``binary`` (kube-score, kubeconform), built now if missing."""
    build.build(build.component_of(binary), echo=lambda _: None)
    return build.binary_path(binary)


# --- schemas for kubeconform --------------------------------------------------------------------


def _schema_name(api_version: str, kind: str) -> str:
    """kubeconform's ``{{ .ResourceKind }}{{ .KindSuffix }}.json`` (pkg/registry/registry.go
    schemaPath): the kind in lower case, the group's first label, the version."""
    group, _, version = api_version.rpartition("/")
    suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
    return f"{kind.lower()}{suffix}.json"


_DEFINITIONS = "/api/_definitions.json#/$defs/"


def _standalone(node: Any, defs: dict[str, Any], needed: dict[str, Any]) -> Any:
    """``node`` with its references to the bundle's shared definitions pointed at its own
    ``$defs``, which gather (in ``needed``) every definition it reaches, and no ``$id``: a
    schema kubeconform compiles without fetching anything, and only what it needs."""
    if isinstance(node, list):
        return [_standalone(v, defs, needed) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _standalone(v, defs, needed) for k, v in node.items() if k != "$id"}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith(("#/$defs/", _DEFINITIONS)):
        name = ref.rsplit("/", 1)[1]
        out["$ref"] = f"#/$defs/{name}"
        if name not in needed:
            needed[name] = {}  # placed first: definitions refer to each other in cycles
            needed[name] = _standalone(defs[name], defs, needed)
    return out


def _crd_schemas(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    out = {}
    for version in crd["spec"]["versions"]:
        schema = to_json_schema(version["schema"]["openAPIV3Schema"])
        # Every object has these, whether the CRD's schema lists them or not.
        implicit = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}}
        implicit["metadata"] = {"type": "object"}
        schema["properties"] = {**implicit, **schema.get("properties", {})}
        out[_schema_name(f"{group}/{version['name']}", kind)] = {"$schema": DRAFT7, **schema}
    return out


def _structure_schema(path: Path) -> tuple[str, dict[str, Any]]:
    """tests/schemas/<kind>-<group>-<version>.structure.json: a CRD's spec structure."""
    _kind, group, version = re.fullmatch(
        r"([a-z]+)-([a-z0-9.]+)-(v[0-9a-z]+)\.structure", path.stem
    ).groups()
    data = json.loads(path.read_text())
    schema = {
        "$schema": DRAFT7,
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"enum": [f"{group}/{version}"]},
            "kind": {"enum": [data["kind"]]},
            "metadata": {"type": "object"},
            "spec": to_json_schema(data["spec"]),
        },
    }
    return _schema_name(f"{group}/{version}", data["kind"]), schema


def write_schemas(folder: Path, kinds: Iterable[tuple[str, str]]) -> Path:
    """The schema folder kubeconform reads: the built-in ones of ``kinds`` ((apiVersion, kind)
    pairs) and the custom resources above."""
    folder.mkdir(parents=True, exist_ok=True)
    bundled = (
        Path(kubernetes_validate.__file__).parent
        / "kubernetes-json-schema"
        / f"v{K8S_VERSION}-local-strict"
    )
    defs = json.loads((bundled / "_definitions.json").read_text())["$defs"]
    for api_version, kind in set(kinds):
        path = bundled / _schema_name(api_version, kind)
        if path.exists():
            needed: dict[str, Any] = {}
            schema = _standalone(json.loads(path.read_text()), defs, needed)
            (folder / path.name).write_text(json.dumps({**schema, "$defs": needed}))
    for module, rel in CRD_SOURCES:
        base = build.module_source(module) if module else REPO
        for crd in yaml.load_all((base / rel).read_text(), Loader=_YAML_LOADER):
            for name, schema in _crd_schemas(crd).items():
                (folder / name).write_text(json.dumps(schema))
    for path in PROMETHEUS_STRUCTURES:
        name, schema = _structure_schema(path)
        (folder / name).write_text(json.dumps(schema))
    return folder


# --- the two tools -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One kube-score check an object did not pass."""

    check: str
    kind: str
    name: str
    render: str  # the object's namespace: each render has its own
    text: str

    def __str__(self) -> str:
        return f"{self.check} {self.kind}/{self.name} in {self.render}: {self.text}"


def kubeconform(files: Sequence[Path], schemas: Path) -> list[dict[str, Any]]:
    """kubeconform -strict's verdict on every document of ``files`` (one entry each)."""
    proc = subprocess.run(
        [
            str(tool("kubeconform")),
            "-strict",
            "-verbose",
            "-output",
            "json",
            "-kubernetes-version",
            K8S_VERSION,
            "-schema-location",
            f"{schemas}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return json.loads(proc.stdout)["resources"]


def kube_score(files: Sequence[Path]) -> list[Finding]:
    """kube-score's findings (every check below OK, optional checks on) over ``files``."""
    proc = subprocess.run(
        [
            str(tool("kube-score")),
            "score",
            "--all-default-optional",
            "--kubernetes-version",
            "v" + ".".join(K8S_VERSION.split(".")[:2]),
            "--output-format",
            "json",
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode not in (0, 1):  # 1: it found something
        raise RuntimeError(f"kube-score failed (exit {proc.returncode}): {proc.stderr}")
    findings = []
    for obj in json.loads(proc.stdout):
        meta = obj["object_meta"]
        for check in obj["checks"]:
            if check["skipped"] or check["grade"] >= 10:
                continue
            comments = "; ".join(
                f"{c.get('path') or ''} {c['summary']}".strip() for c in check["comments"] or []
            )
            findings.append(
                Finding(
                    check["check"]["id"],
                    obj["type_meta"]["kind"],
                    meta["name"],
                    meta.get("namespace", ""),
                    comments,
                )
            )
    return findings


# --- the justifications in the docs --------------------------------------------------------------


@dataclass(frozen=True)
class Justification:
    """A row of the docs' table: a check accepted for objects in renders (glob patterns)."""

    check: str
    objects: tuple[str, ...]  # Kind/name patterns
    renders: tuple[str, ...]
    why: str

    def covers(self, finding: Finding) -> bool:
        return (
            finding.check == self.check
            and any(fnmatch.fnmatchcase(f"{finding.kind}/{finding.name}", o) for o in self.objects)
            and any(fnmatch.fnmatchcase(finding.render, r) for r in self.renders)
        )


def _cells(line: str) -> list[str]:
    return [c.strip().strip("`").strip() for c in line.strip().strip("|").split("|")]


def _patterns(cell: str) -> tuple[str, ...]:
    return tuple(p.strip().strip("`") for p in cell.split(",") if p.strip())


def justifications(text: str | None = None) -> list[Justification]:
    """The rows of the table under :data:`JUSTIFICATIONS_HEADING` (columns: check, objects,
    renders, why)."""
    text = JUSTIFICATIONS.read_text() if text is None else text
    section = text.split(JUSTIFICATIONS_HEADING, 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header, _rule, *body = rows
    assert _cells(header)[:3] == ["Check", "Objects", "Renders"], header
    out = []
    for line in body:
        check, objects, renders, why = _cells(line)
        out.append(Justification(check, _patterns(objects), _patterns(renders), why))
    return out


def unjustified(
    findings: Iterable[Finding], rows: Sequence[Justification]
) -> tuple[list[Finding], list[Justification]]:
    """The findings no row covers, and the rows that cover no finding (stale)."""
    findings = list(findings)
    left = [f for f in findings if not any(r.covers(f) for r in rows)]
    stale = [r for r in rows if not any(r.covers(f) for f in findings)]
    return left, stale
