"""``megdet controller``: run the MegDetRun operator (the controller image's command), logged
in with the pod's service account or else the current kubeconfig context. Its ports and high
availability (kopf's peering): docs/operations.md, "The controller"; who may read /metrics:
docs/monitoring.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
from pathlib import Path
from typing import Any

import yaml

from megdet.cli import UsageError, whole_number
from megdet.policy import Policy, PolicyError

#: Objects of one watched kind the controller handles at once once it has listed them all
#: (``--worker-limit``; the operator chart's ``controller.workerLimit`` has the same default):
#: controller/operator.py, ``limit_workers``; the measurements in docs/capacity.md.
DEFAULT_WORKER_LIMIT = 100

__all__ = ["build_parser_args", "positive_seconds", "priority_value", "register", "run"]

#: The highest priority ``random`` draws; kopf compares priorities as plain integers.
MAX_RANDOM_PRIORITY = 2**31 - 1
#: ``--progress-ca-secret``: a namespace (DNS label) / a Secret name (DNS subdomain).
_DNS_PAIR = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def priority_value(text: str) -> int:
    """``--priority``: a whole number, or ``random`` for a fresh one per process."""
    if text == "random":
        return random.SystemRandom().randint(1, MAX_RANDOM_PRIORITY)
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number or 'random'") from None


def positive_seconds(text: str) -> float:
    """``--api-timeout``: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return value


def register(subparsers: Any) -> None:
    """Add ``megdet controller`` to the CLI."""
    parser = subparsers.add_parser(
        "controller",
        help="run the MegDetRun operator (kopf)",
        description="Run the MegDetRun operator: validate runs, create and own their jobs, "
        "mirror job status. Serves /metrics and /healthz.",
    )
    build_parser_args(parser)
    parser.set_defaults(handler=run)


def _port(group: Any, flag: str, default: int, what: str) -> None:
    """A port flag (at most 65535: :func:`run` says so naming the flag)."""
    group.add_argument(
        flag, type=whole_number(minimum=1), default=default, help=f"{what} (default: {default})"
    )


def build_parser_args(parser: argparse.ArgumentParser) -> None:
    """The ``megdet controller`` flags."""
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="serve only this namespace (repeatable; default: all namespaces)",
    )
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering",
        default="megdet-controller",
        metavar="NAME",
        help="kopf peering object the replicas share: a ClusterKopfPeering, or with --namespace "
        "a KopfPeering of that name in each namespace (default: megdet-controller)",
    )
    peering.add_argument(
        "--standalone",
        action="store_true",
        help="no peering: a single replica (development)",
    )
    parser.add_argument(
        "--priority",
        type=priority_value,
        default="random",
        help="peering priority, a whole number or 'random' (default: random)",
    )
    _port(parser, "--metrics-port", 8080, "port for Prometheus /metrics")
    parser.add_argument(
        "--metrics-secure",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve /metrics over HTTPS to callers the API server authenticates (TokenReview) "
        "and authorizes for get on /metrics (SubjectAccessReview); --no-metrics-secure: plain "
        "HTTP for anyone who reaches the port (default: secure)",
    )
    parser.add_argument(
        "--metrics-cert-dir",
        metavar="DIR",
        help="folder with the metrics server's tls.crt and tls.key (default: a self-signed "
        "certificate generated at start)",
    )
    _port(parser, "--health-port", 8081, "port for kopf's /healthz probe endpoint")
    parser.add_argument(
        "--api-timeout",
        type=positive_seconds,
        default=10.0,
        help="seconds before an API call of the controller's client gives up (default: 10)",
    )
    parser.add_argument(
        "--policy-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="the cluster's MegDet policy (the operator chart's `policy` values as JSON or YAML; "
        "default: the chart's secure defaults); see docs/operations.md",
    )
    progress = parser.add_argument_group(
        'progress reporting (target pytorchjob; docs/architecture.md, "Progress reporting")'
    )
    progress.add_argument(
        "--progress-url",
        default="",
        metavar="URL",
        help="base URL the runs' pods reach the progress endpoint at, e.g. "
        "https://megdet-operator-progress.megdet-system.svc:8443 (default: '' = no progress "
        "endpoint, nothing injected into runs)",
    )
    _port(progress, "--progress-port", 8443, "HTTPS port of the progress endpoint")
    progress.add_argument(
        "--progress-cert-dir",
        metavar="DIR",
        help="folder with the endpoint's tls.crt, tls.key and ca.crt (default: a self-signed "
        "CA and certificate generated at start)",
    )
    progress.add_argument(
        "--progress-ca-secret",
        default="",
        metavar="NAMESPACE/NAME",
        help="Secret holding the endpoint's CA and certificate, shared by the replicas: the "
        "first replica that finds none creates it, so the CA the pods trust survives restarts "
        "and failovers (default: '' = a CA of this process's own; ignored with "
        "--progress-cert-dir)",
    )
    progress.add_argument(
        "--progress-interval",
        type=positive_seconds,
        default=30.0,
        help="seconds between two status.progress writes of one run, at most one write per "
        "interval (default: 30)",
    )
    progress.add_argument(
        "--progress-checkpoint-events",
        type=whole_number(minimum=1),
        default=5,
        metavar="K",
        help="post a Checkpointed event every K-th checkpoint (default: 5)",
    )
    parser.add_argument(
        "--max-connections",
        type=whole_number(minimum=1),
        default=128,
        metavar="N",
        help="connections each of the /metrics and progress servers serves at once (8 per "
        "source address); at the cap the oldest unfinished request makes room (default: 128)",
    )
    parser.add_argument(
        "--request-timeout",
        type=positive_seconds,
        default=10.0,
        metavar="SECONDS",
        help="seconds a request to /metrics or the progress endpoint has to arrive in full: "
        "TLS handshake, headers and body together (default: 10)",
    )
    parser.add_argument(
        "--workers",
        type=whole_number(minimum=1),
        default=None,
        metavar="N",
        help="threads that run the handlers (the render and the blocking API calls; default: "
        "kopf's, the node's cores + 4, at most 32); see docs/capacity.md",
    )
    parser.add_argument(
        "--worker-limit",
        type=whole_number(minimum=0),
        default=DEFAULT_WORKER_LIMIT,
        metavar="N",
        help="objects of each watched kind handled at once once the controller has listed "
        "everything (the rest wait in their queues; it bounds a burst's memory); 0: no limit "
        f"(default: {DEFAULT_WORKER_LIMIT}); see docs/capacity.md",
    )
    parser.add_argument(
        "--log-level",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default="INFO",
        help="log level (default: INFO)",
    )


def load_policy(path: Path | None) -> Policy:
    """The policy in ``path`` (JSON or YAML), or the chart's defaults; a UsageError names the
    flag or the policy key that is wrong."""
    if path is None:
        return Policy()
    try:
        text = path.read_text()
    except OSError as err:
        raise UsageError(f"--policy-file {path}: {err.strerror or err}") from None
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise UsageError(f"--policy-file {path}: not JSON or YAML: {err}") from None
    try:
        return Policy.from_values(values)
    except PolicyError as err:
        raise UsageError(f"--policy-file {path}: {err}") from None


def run(args: argparse.Namespace) -> int:
    """Start the operator and block until it stops (SIGTERM/SIGINT)."""
    # Imported here: `megdet --help` must not need kopf or the Kubernetes client.
    import kopf
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    from megdet.controller import metrics
    from megdet.controller.heap import HeapTrimmer
    from megdet.controller.http_limits import Limits
    from megdet.controller.kubeapi import Cluster
    from megdet.controller.operator import build_registry, configure, limit_workers
    from megdet.controller.reconciler import Reconciler
    from megdet.controller.tokenauth import KubernetesReviewer, TokenAuthorizer

    for port, name in ((args.metrics_port, "--metrics-port"), (args.health_port, "--health-port")):
        if port > 65535:
            raise UsageError(f"{name} {port} must be <= 65535")
    if args.metrics_port == args.health_port:
        raise UsageError("--metrics-port and --health-port must differ")
    if args.progress_url:
        url = args.progress_url
        if not url.startswith("https://") or any(c.isspace() for c in url):
            raise UsageError(
                f"--progress-url {args.progress_url!r} must be an https:// URL (the pods verify "
                "the endpoint's certificate)"
            )
        if args.progress_port > 65535:
            raise UsageError(f"--progress-port {args.progress_port} must be <= 65535")
        if args.progress_port in (args.metrics_port, args.health_port):
            raise UsageError("--progress-port must differ from --metrics-port and --health-port")
        if args.progress_ca_secret and not _DNS_PAIR.fullmatch(args.progress_ca_secret):
            raise UsageError(
                f"--progress-ca-secret {args.progress_ca_secret!r} must be NAMESPACE/NAME "
                "(lower-case DNS names)"
            )
    if args.metrics_cert_dir is not None and not args.metrics_secure:
        raise UsageError("--metrics-cert-dir needs --metrics-secure (it is plain HTTP now)")
    ssl_context = None
    if args.metrics_secure:
        try:  # before logging in: a bad flag is reported first
            ssl_context = metrics.server_ssl_context(args.metrics_cert_dir)
        except ValueError as err:
            raise UsageError(f"--metrics-cert-dir: {err}") from None
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )

    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        try:
            k8s_config.load_kube_config()
        except (k8s_config.ConfigException, OSError) as err:
            raise UsageError(f"no in-cluster service account and no kubeconfig: {err}") from None
    api = k8s.ApiClient()
    api.user_agent = "megdet-controller"
    reconciler = Reconciler(
        Cluster(api, timeout=args.api_timeout),
        policy=load_policy(args.policy_file),
        # Checkpointed events every K-th checkpoint, on both targets (progress_events.py).
        checkpoint_events=args.progress_checkpoint_events,
        progress_url=args.progress_url,  # given to every run's render ("" = none)
    )
    settings = kopf.OperatorSettings()
    configure(
        settings,
        diffbase=reconciler.diffbase,
        peering=None if args.standalone else args.peering,
        workers=args.workers,
    )
    settings.peering.priority = args.priority
    settings.posting.reporting_component = "megdet-controller"
    settings.posting.reporting_instance = os.environ.get("POD_ID", "megdet-controller")

    authorizer = None
    if args.metrics_secure:
        authorizer = TokenAuthorizer(KubernetesReviewer(api, timeout=args.api_timeout))
    limits = Limits(max_connections=args.max_connections, request_timeout=args.request_timeout)
    metrics.serve(args.metrics_port, limits=limits, ssl_context=ssl_context, authorizer=authorizer)
    service = None
    if args.progress_url:
        from megdet.controller import progress_server

        try:
            service = progress_server.start(
                api,
                url=args.progress_url,
                port=args.progress_port,
                cert_dir=args.progress_cert_dir,
                ca_secret=args.progress_ca_secret,
                interval=args.progress_interval,
                timeout=args.api_timeout,
                namespaces=list(args.namespace),
                limits=limits,
            )
        except ValueError as err:
            raise UsageError(str(err)) from None
        except k8s.ApiException as err:  # the shared Secret could not be read or created
            raise UsageError(
                f"--progress-ca-secret {args.progress_ca_secret}: {err.status} {err.reason}"
            ) from None
        except OSError as err:
            raise UsageError(f"--progress-port {args.progress_port}: {err}") from None
    registry = build_registry(reconciler)
    if args.worker_limit:
        limit_workers(registry, settings, args.worker_limit)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    # A burst of runs leaves freed memory in the C allocator's arenas (jemalloc's in the image,
    # else glibc's): give it back once the burst is over (controller/heap.py).
    trimmer = HeapTrimmer().start()
    try:
        kopf.run(
            registry=registry,
            settings=settings,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz",
        )
    finally:
        trimmer.stop()
        if service is not None:
            service.stop()
    return 0
