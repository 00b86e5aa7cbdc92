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
``megdet render --pods`` prints instead the pods the job creates, as plain Pods for linters
(:mod:`megdet.api.pods`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megdet.api.documents import (
    Document,
    document_problems,
    owned_objects,
    print_objects,
    read_documents,
    report_input_errors,
    report_invalid,
    report_problems,
)
from megdet.controller.api import RUN_API_VERSION

__all__ = ["Document", "read_documents", "register"]


def run_validate(args: argparse.Namespace) -> int:
    if not server_mode(args):
        extra = [f for f in ("context", "namespace") if getattr(args, f) is not None]
        if extra:
            print(
                f"megdet validate: error: --{extra[0]} needs --kubeconfig or --server-dry-run "
                "(without them validate runs offline)",
                file=sys.stderr,
            )
            return 2
    documents, errors = read_documents(args.file)
    report_input_errors("validate", errors)
    if server_mode(args):
        if errors:
            return 2
        try:
            return run_validate_server(args, documents)
        except ServerError as err:
            print(f"megdet validate: error: {err}", file=sys.stderr)
            return 2
    failed = report_problems(documents, document_problems, "valid", quiet=args.quiet)
    if errors:
        return 2
    return 1 if failed else 0


def run_render(args: argparse.Namespace) -> int:
    if args.pods:
        from megdet.api.pods import run_render_pods

        return run_render_pods(args)
    documents, errors = read_documents(args.file)
    report_input_errors("render", errors)
    if errors:
        return 2
    if report_invalid(documents):
        return 1
    print_objects(obj for doc in documents for obj in owned_objects(doc, args.owner_uid))
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
        description="Check MegDetRuns. Offline (the default): the CRD's schema and CEL rules, "
        "the plan, owned overrides and the run chart, no cluster needed. With --kubeconfig or "
        "--server-dry-run: a server-side dry-run create (dryRun=All, nothing stored) of each "
        "run, so the API server's schema, CEL, defaults and admission policy decide, then the "
        "controller's own checks (plan, chart render) on the server-defaulted object. One "
        "line per problem; exit 0 valid, 1 problems, 2 unreadable or empty input or an error "
        "talking to the API server.",
    )
    _add_files(validate)
    validate.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    server = validate.add_argument_group(
        "server mode", "ask the API server (offline unless one of the first two is given)"
    )
    server.add_argument(
        "--server-dry-run",
        action="store_true",
        help="ask the API server of $KUBECONFIG (or ~/.kube/config), as kubectl would",
    )
    server.add_argument(
        "--kubeconfig", metavar="PATH", help="ask the API server of this kubeconfig"
    )
    server.add_argument("--context", metavar="NAME", help="the kubeconfig context to use")
    server.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help="namespace of runs that name none (default: the context's, else 'default')",
    )
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
    render.add_argument(
        "--pods",
        action="store_true",
        help="print instead the pods the run's job creates, as plain v1 Pods (PyTorchJob "
        "replicas, TrainingRuntime replicated jobs) for linters that skip custom resources; "
        "also reads what the run chart rendered (helm template charts/megdet)",
    )
    render.set_defaults(handler=run_render)


# ------------------------------------------------------------------------------------------
# --kubeconfig / --server-dry-run: the API server's verdict (schema, CEL, defaults, admission
# policy), then the controller's own checks on the object the server would store.

#: HTTP statuses of a dry-run create that are the server refusing the object (not an error
#: talking to it): 400 undecodable or unknown field (fieldValidation=Strict), 422 schema or
#: CEL, 403 only when an admission policy denied it (an RBAC 403 is an error: exit 2).
_REFUSALS = (400, 422)
_ADMISSION_DENIED = "denied request: "


class ServerError(Exception):
    """Talking to the API server failed; the message names the flag to fix."""


def server_mode(args: argparse.Namespace) -> bool:
    """Server mode only when asked for: offline stays the default (CI without a cluster)."""
    return bool(args.server_dry_run or args.kubeconfig)


def _kubeconfig_path(args: argparse.Namespace) -> tuple[str, str]:
    """The kubeconfig file and the flag (or variable) that chose it."""
    import os

    if args.kubeconfig:
        return args.kubeconfig, "--kubeconfig"
    env = os.environ.get("KUBECONFIG", "")
    if env:
        # kubectl merges a ':'-separated list; the first file that exists is the one we read.
        paths = [p for p in env.split(os.pathsep) if p]
        existing = [p for p in paths if Path(p).is_file()]
        return (existing or paths)[0], "$KUBECONFIG"
    return str(Path.home() / ".kube" / "config"), "--server-dry-run (default ~/.kube/config)"


@dataclass
class ServerTarget:
    api: Any  # kubernetes.client.CustomObjectsApi
    host: str
    namespace: str
    where: str  # for messages: "kubeconfig PATH, context NAME"
    flag: str  # the flag (or variable) that chose the kubeconfig, for error messages


def connect(args: argparse.Namespace) -> ServerTarget:
    """A client for the kubeconfig's context; ServerError naming the flag if that fails."""
    path, flag = _kubeconfig_path(args)
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise ServerError(
            f"{flag}: the kubernetes client is not installed (pip install 'megdet[controller]')"
        ) from None
    if not Path(path).is_file():
        raise ServerError(f"{flag}: no kubeconfig file at {path}")
    try:
        contexts, active = config.list_kube_config_contexts(config_file=path)
        by_name = {c["name"]: c for c in contexts or []}
        if args.context is not None and args.context not in by_name:
            known = ", ".join(sorted(by_name)) or "none"
            raise ServerError(f"--context: no context {args.context!r} in {path} (it has: {known})")
        chosen = by_name[args.context] if args.context is not None else active
        configuration = client.Configuration()
        config.load_kube_config(
            config_file=path, context=args.context, client_configuration=configuration
        )
    except ServerError:
        raise
    except (ConfigException, OSError, ValueError, KeyError, TypeError) as err:
        raise ServerError(f"{flag}: cannot use kubeconfig {path}: {err}") from None
    configuration.retries = 0  # an unreachable server is reported at once, not after retries
    namespace = args.namespace or (chosen or {}).get("context", {}).get("namespace") or "default"
    context = (chosen or {}).get("name", "?")
    api = client.CustomObjectsApi(client.ApiClient(configuration))
    where = f"kubeconfig {path}, context {context}"
    return ServerTarget(api, configuration.host, namespace, where, flag)


def _status(body: str | None) -> dict[str, Any]:
    import json

    try:
        status = json.loads(body or "")
    except ValueError:
        return {}
    return status if isinstance(status, dict) else {}


def refusal_lines(status_code: int, body: str | None) -> list[str] | None:
    """The server's refusal as ``field: message`` lines; None if it is not a refusal of the
    object (RBAC, missing namespace or CRD, server errors: an error talking to the server)."""
    status = _status(body)
    message = str(status.get("message") or body or "").strip()
    if status_code == 403 and _ADMISSION_DENIED in message:
        # "... is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request:
        # spec.image.repository: ..." (megdet/policy/ puts the field first).
        return [message.split(_ADMISSION_DENIED, 1)[1]]
    if status_code not in _REFUSALS:
        return None
    causes = (status.get("details") or {}).get("causes") or []
    lines = []
    for cause in causes:
        if not isinstance(cause, dict):
            continue
        field = cause.get("field") or ""
        text = str(cause.get("message") or cause.get("reason") or "").strip()
        lines.append(f"{field}: {text}" if field else text)
    return lines or [message or f"refused (HTTP {status_code})"]


def dry_run_create(target: ServerTarget, doc: Document) -> tuple[dict[str, Any] | None, list[str]]:
    """(the object the server would store, []) or (None, the refusal's lines)."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    meta = doc.body.get("metadata")
    given = meta.get("namespace") if isinstance(meta, Mapping) else None
    namespace = given if isinstance(given, str) and given else target.namespace
    try:
        stored = target.api.create_namespaced_custom_object(
            "megdet.io",
            RUN_API_VERSION.split("/", 1)[1],
            namespace,
            "megdetruns",
            doc.body,
            dry_run="All",
            field_validation="Strict",  # as kubectl: an unknown field is refused, not dropped
            _request_timeout=60,
        )
    except ApiException as err:
        lines = refusal_lines(err.status, err.body)
        if lines is None:
            message = _status(err.body).get("message") or err.reason or err.body
            flag = (
                "--namespace" if err.status == 404 and "namespace" in str(message) else target.flag
            )
            raise ServerError(
                f"{flag}: the API server at {target.host} answered HTTP {err.status} "
                f"for {doc.label()} in namespace {namespace}: {message} ({target.where})"
            ) from None
        return None, lines
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise ServerError(
            f"{target.flag}: cannot reach the API server at {target.host} ({target.where}): "
            f"{type(err).__name__}: {err}"
        ) from None
    return stored, []


def controller_problems(stored: Mapping[str, Any]) -> list[str]:
    """The controller's own checks (the operator's values refused, then one render of the run
    chart: Helm's values schema and fails, RunSpec + plan_run) on the object as the server would
    store it: defaulted, with its namespace and uid."""
    from megdet.controller.planning import Invalid, plan_children

    planned = plan_children(stored)
    return planned.messages if isinstance(planned, Invalid) else []


def run_validate_server(args: argparse.Namespace, documents: list[Document]) -> int:
    target = connect(args)
    print(
        f"megdet validate: server dry-run at {target.host} ({target.where})",
        file=sys.stderr,
    )

    def problems_of(doc: Document) -> list[str]:
        stored, problems = dry_run_create(target, doc)
        return controller_problems(stored) if stored is not None else problems

    failed = report_problems(
        documents,
        problems_of,
        "valid (API server dry-run and controller checks)",
        quiet=args.quiet,
    )
    return 1 if failed else 0
