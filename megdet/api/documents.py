"""The MegDetRun documents of ``megdet validate`` and ``megdet render``: read from files,
checked, reported, and what the controller creates for each.

Shared by :mod:`megdet.api.cli` and :mod:`megdet.api.pods`
(``megdet render --pods``), which the CLI dispatches to, so it imports neither.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megdet.controller.api import KIND, RUN_API_VERSION

__all__ = [
    "Document",
    "document_problems",
    "owned_objects",
    "print_objects",
    "read_documents",
    "report_input_errors",
    "report_invalid",
    "report_problems",
]

_TOP_LEVEL = {"apiVersion", "kind", "metadata", "spec", "status"}


@dataclass(frozen=True)
class Document:
    """One MegDetRun read from a file: where it came from and its body."""

    source: str
    index: int
    body: dict[str, Any]

    @property
    def name(self) -> str:
        meta = self.body.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        return name if isinstance(name, str) and name else "<no name>"

    @property
    def namespace(self) -> str:
        meta = self.body.get("metadata")
        namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
        return namespace if isinstance(namespace, str) and namespace else "default"

    def label(self) -> str:
        return f"{self.source}#{self.index} {KIND}/{self.name}"


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    return Path(path).read_text(encoding="utf-8")


def read_documents(
    paths: Iterable[str], also: Collection[tuple[str, str]] = ()
) -> tuple[list[Document], list[str]]:
    """The MegDetRuns in ``paths`` ('-' is stdin), and one message per bad input; ``also``:
    other (apiVersion, kind) pairs read as documents too."""
    import yaml

    documents: list[Document] = []
    errors: list[str] = []
    for path in paths:
        source = "<stdin>" if path == "-" else path
        try:
            docs = list(yaml.safe_load_all(_read_text(path)))
        except (OSError, UnicodeDecodeError) as err:
            errors.append(f"{source}: cannot read: {getattr(err, 'strerror', None) or err}")
            continue
        except yaml.YAMLError as err:
            where = getattr(err, "problem_mark", None)
            line = f" (line {where.line + 1})" if where is not None else ""
            errors.append(f"{source}: not YAML{line}: {getattr(err, 'problem', None) or err}")
            continue
        if all(body is None for body in docs):
            # Nothing to check is not "valid": a CI step pointed at the wrong file must fail.
            errors.append(f"{source}: no {KIND} in it (the file has no YAML documents)")
            continue
        for index, body in enumerate(docs):
            if body is None:
                continue  # an empty document, e.g. after a trailing '---'
            what = (body.get("apiVersion"), body.get("kind")) if isinstance(body, dict) else None
            if what != (RUN_API_VERSION, KIND) and what not in also:
                shown = f"apiVersion {what[0]!r}, kind {what[1]!r}" if what else "not a mapping"
                wanted = f"want apiVersion {RUN_API_VERSION}"
                if also:
                    wanted += " or one of " + ", ".join(f"{a} {k}" for a, k in sorted(also))
                errors.append(f"{source}#{index}: not a {KIND} ({shown}; {wanted})")
                continue
            documents.append(Document(source, index, body))
    return documents, errors


def document_problems(doc: Document) -> list[str]:
    """Every problem with one MegDetRun, as ``spec.field: message`` strings."""
    from megdet.api.validation import validate_run

    body = doc.body
    problems = [f"{key}: unknown field" for key in sorted(set(body) - _TOP_LEVEL)]
    meta = body.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        problems.append("metadata.name: is required")
    if "spec" not in body:
        return [*problems, "spec: is required"]
    name = doc.name if doc.name != "<no name>" else None
    found = validate_run(body["spec"], name=name, namespace=doc.namespace)
    return problems + [str(p) for p in found]


def report_input_errors(command: str, errors: list[str]) -> None:
    for error in errors:
        print(f"megdet {command}: error: {error}", file=sys.stderr)


def report_problems(
    documents: list[Document],
    problems_of: Callable[[Document], list[str]],
    valid: str,
    *,
    quiet: bool,
) -> bool:
    """Print each document's problems, one line each (``<file>#<n> <name>: <problem>``), or
    ``<label>: <valid>`` for a document with none unless ``quiet``; whether any had one."""
    failed = False
    for doc in documents:
        problems = problems_of(doc)
        failed = failed or bool(problems)
        for problem in problems:
            print(f"{doc.label()}: {problem}")
        if not problems and not quiet:
            print(f"{doc.label()}: {valid}")
    return failed


def owned_objects(doc: Document, owner_uid: str | None) -> list[dict[str, Any]]:
    """What the controller creates for a valid run (with its owner reference if uid given)."""
    from megdet.controller.render import render_run

    if owner_uid is None:
        return list(render_run(doc.name, doc.namespace, doc.body["spec"]).objects)
    from megdet.controller.planning import Planned, plan_children

    body = dict(doc.body)
    body["metadata"] = {**body["metadata"], "namespace": doc.namespace, "uid": owner_uid}
    planned = plan_children(body)
    if not isinstance(planned, Planned):  # validated above; kept for a clear message
        raise SystemExit(f"megdet render: {doc.label()}: {'; '.join(planned.messages)}")
    return list(planned.objects)


def report_invalid(documents: Iterable[Document]) -> bool:
    """Print each MegDetRun's problems to stderr (``<label>: <problem>``); whether any had one."""
    invalid = False
    for doc in documents:
        for problem in document_problems(doc):
            invalid = True
            print(f"{doc.label()}: {problem}", file=sys.stderr)
    return invalid


def print_objects(objects: Iterable[Mapping[str, Any]]) -> None:
    """``objects`` to stdout as one YAML stream, each document after a ``---``."""
    import yaml

    out = [yaml.safe_dump(obj, sort_keys=False, default_flow_style=False) for obj in objects]
    sys.stdout.write("---\n" + "---\n".join(out) if out else "")
