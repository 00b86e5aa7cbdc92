"""``python -m cluster``: ``make cluster`` (up), ``make cluster-images`` (load-images),
``make cluster-down`` (down) and status, over cluster.control_plane's Cluster."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from cluster import build
from cluster.control_plane import DEFAULT_STATE, Cluster, ClusterError
from cluster.local_images import ARCHIVES, link_clients, load_images
from cluster.node import NodeError
from imagebuild.build import VARIANTS


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cluster",
        description="A real Kubernetes control plane on this machine (make cluster).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "up",
        help="build (first time) and start the cluster, then load the images built here into "
        "its real node; no-op when up",
    )
    up.add_argument("--nodes", type=int, default=4, help="fake 8-GPU nodes (default 4)")
    up.add_argument(
        "--trainer-v2",
        action="store_true",
        help="also JobSet and Kubeflow Trainer v2 (target: trainjob); starts them on a running "
        "cluster too",
    )
    up.add_argument("--kueue", action="store_true", help="also Kueue (with JobSet and Trainer v2)")
    up.add_argument(
        "--no-real-node",
        dest="real_node",
        action="store_false",
        help="only kwok nodes: no kubelet, containerd, kube-proxy and CoreDNS (docs/cluster.md)",
    )
    load = sub.add_parser(
        "load-images",
        help=f"import the images `make image` / `make suite-images` built ({ARCHIVES}) into "
        "the real node's containerd (make cluster-images)",
    )
    load.add_argument(
        "images",
        nargs="*",
        metavar="IMAGE",
        help=f"a variant ({', '.join(VARIANTS)}) or an OCI archive file (default: every "
        "variant built)",
    )
    sub.add_parser("down", help="stop every process the cluster started and delete its state")
    sub.add_parser("status", help="say whether the cluster is up")
    for p in sub.choices.values():
        p.add_argument(
            "--state", type=Path, default=DEFAULT_STATE, help="state folder (default .cluster)"
        )
    return parser


def up(cluster: Cluster) -> None:
    cluster.up()
    # A cluster that was up already gets what the flags add (a no-op otherwise).
    if cluster._extra_components():
        started = cluster._start_extras(cluster._extra_components(), 180)
        if started:
            print(f"started {', '.join(started)}")
    link_clients(cluster)
    state = cluster.state() or {}
    if cluster.real_node and "node" in state and cluster.running("kubelet", state):
        load_images(cluster)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "nodes", 1) < 1:
        parser().error("--nodes must be at least 1")
    cluster = Cluster(
        root=args.state.resolve(),
        nodes=getattr(args, "nodes", 4),
        trainer_v2=getattr(args, "trainer_v2", False),
        kueue=getattr(args, "kueue", False),
        real_node=getattr(args, "real_node", False),
    )
    try:
        if args.command == "up":
            up(cluster)
        elif args.command == "load-images":
            load_images(cluster, args.images, required=True)
        elif args.command == "down":
            stopped = cluster.down()
            print(
                f"cluster down (stopped: {', '.join(stopped) or 'nothing was running'}; "
                f"deleted {cluster.root})"
            )
        else:
            print("up" if cluster.is_up() else "down")
            return 0 if cluster.is_up() else 1
    except (ClusterError, NodeError, build.BuildError) as err:
        print(f"megdet cluster {args.command}: error: {err}", file=sys.stderr)
        return 1
    return 0
