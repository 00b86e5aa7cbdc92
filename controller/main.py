"""``megdet controller``: run the MegDetRun operator (the controller image's command).

In a pod it logs in with its service account; elsewhere with the current kubeconfig context.
It serves Prometheus metrics on ``--metrics-port`` (``/metrics``) and kopf's health endpoint
on ``--health-port`` (``/healthz``, for the liveness and readiness probes).

High availability: every replica joins the kopf peering object ``--peering`` with a priority
(``random`` by default, so replicas differ); kopf pauses a replica while a live peer with a
higher priority exists, so exactly one acts. See docs/operations.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
from typing import Any

from megdet.cli import UsageError, whole_number

__all__ = ["build_parser_args", "positive_seconds", "priority_value", "register", "run"]

#: The highest priority ``random`` draws; kopf compares priorities as plain integers.
MAX_RANDOM_PRIORITY = 2**31 - 1


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
    parser.add_argument(
        "--metrics-port",
        type=whole_number(minimum=1),
        default=8080,
        help="port for Prometheus /metrics (default: 8080)",
    )
    parser.add_argument(
        "--health-port",
        type=whole_number(minimum=1),
        default=8081,
        help="port for kopf's /healthz probe endpoint (default: 8081)",
    )
    parser.add_argument(
        "--api-timeout",
        type=positive_seconds,
        default=10.0,
        help="seconds before an API call of the controller's client gives up (default: 10)",
    )
    parser.add_argument(
        "--log-level",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default="INFO",
        help="log level (default: INFO)",
    )


def run(args: argparse.Namespace) -> int:
    """Start the operator and block until it stops (SIGTERM/SIGINT)."""
    # Imported here: `megdet --help` must not need kopf or the Kubernetes client.
    import kopf
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    from megdet.controller import metrics
    from megdet.controller.operator import Cluster, build_registry, configure

    for port, name in ((args.metrics_port, "--metrics-port"), (args.health_port, "--health-port")):
        if port > 65535:
            raise UsageError(f"{name} {port} must be <= 65535")
    if args.metrics_port == args.health_port:
        raise UsageError("--metrics-port and --health-port must differ")
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
    registry = build_registry(Cluster(api, timeout=args.api_timeout))

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    settings = kopf.OperatorSettings()
    configure(settings, peering=None if args.standalone else args.peering)
    settings.peering.priority = args.priority
    settings.posting.reporting_component = "megdet-controller"
    settings.posting.reporting_instance = os.environ.get("POD_ID", "megdet-controller")

    metrics.serve(args.metrics_port)
    kopf.run(
        registry=registry,
        settings=settings,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz",
    )
    return 0
