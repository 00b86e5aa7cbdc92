"""`megdet validate` and `megdet render`: the controller's checks and job builder, offline.

``megdet validate -f run.yaml`` runs every check the cluster would (the CRD's schema and CEL
rules as ``kubectl apply`` does, then the controller's own: plan, owned overrides, the chart)
and prints one line per problem::

    run.yaml#0 MegDetRun/r50: spec.gpus: gpus above gpusPerNode must be a multiple of ...

``<file>#<n>`` is the YAML document's index in the file, counting from 0 (``yq``'s
``documentIndex``). Exit status: 0 all valid, 1 problems found, 2 input that is unreadable, not
YAML, not a MegDetRun or empty.

``megdet render -f run.yaml`` prints what the controller creates for each valid run: every
object the run chart renders, job first, as YAML. The controller also sets
``metadata.ownerReferences`` to the MegDetRun (so deleting the run deletes the job); that needs
the run's uid, which exists only in the cluster, so it is left out unless ``--owner-uid`` is
given. (Applying a job whose owner does not exist would have it garbage-collected at once.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megdet.controller.api import KIND, RUN_API_VERSION

__all__ = ["Document", "read_documents", "register"]

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


def read_documents(paths: Iterable[str]) -> tuple[list[Document], list[str]]:
    """The MegDetRuns in ``paths`` ('-' is stdin), and one message per bad input."""
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
            if what != (RUN_API_VERSION, KIND):
                shown = f"apiVersion {what[0]!r}, kind {what[1]!r}" if what else "not a mapping"
                errors.append(
                    f"{source}#{index}: not a {KIND} ({shown}; want apiVersion {RUN_API_VERSION})"
                )
                continue
            documents.append(Document(source, index, body))
    return documents, errors


def document_problems(doc: Document) -> list[str]:
    """Every problem with one MegDetRun, as ``spec.field: message`` strings."""
    from megdet.controller.validation import validate_run

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


def _report_input_errors(command: str, errors: list[str]) -> None:
    for error in errors:
        print(f"megdet {command}: error: {error}", file=sys.stderr)


def run_validate(args: argparse.Namespace) -> int:
    documents, errors = read_documents(args.file)
    _report_input_errors("validate", errors)
    failed = False
    for doc in documents:
        problems = document_problems(doc)
        failed = failed or bool(problems)
        for problem in problems:
            print(f"{doc.label()}: {problem}")
        if not problems and not args.quiet:
            print(f"{doc.label()}: valid")
    if errors:
        return 2
    return 1 if failed else 0


def _owned_objects(doc: Document, owner_uid: str | None) -> list[dict[str, Any]]:
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


def run_render(args: argparse.Namespace) -> int:
    import yaml

    documents, errors = read_documents(args.file)
    _report_input_errors("render", errors)
    if errors:
        return 2
    invalid = False
    for doc in documents:
        for problem in document_problems(doc):
            invalid = True
            print(f"{doc.label()}: {problem}", file=sys.stderr)
    if invalid:
        return 1
    out: list[str] = []
    for doc in documents:
        for obj in _owned_objects(doc, args.owner_uid):
            out.append(yaml.safe_dump(obj, sort_keys=False, default_flow_style=False))
    sys.stdout.write("---\n" + "---\n".join(out) if out else "")
    return 0


def _add_files(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--file",
        action="append",
        required=True,
        metavar="FILE",
        help="YAML file with one or more MegDetRuns ('-' reads stdin); repeatable",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    validate = subparsers.add_parser(
        "validate",
        help="check MegDetRuns as the cluster and the controller would",
        description="Check MegDetRuns: the CRD's schema and CEL rules, the plan, owned "
        "overrides and the run chart. One line per problem; exit 0 valid, 1 problems, "
        "2 unreadable or empty input.",
    )
    _add_files(validate)
    validate.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    validate.set_defaults(handler=run_validate)

    render = subparsers.add_parser(
        "render",
        help="print the objects the controller creates for MegDetRuns",
        description="Print, as YAML, every object the controller creates for each MegDetRun "
        "(the run chart rendered in process, job first). Owner references need the run's uid "
        "and are added only with --owner-uid.",
    )
    _add_files(render)
    render.add_argument(
        "--owner-uid",
        metavar="UID",
        help="add the controller's owner reference to a MegDetRun with this uid",
    )
    render.set_defaults(handler=run_render)
