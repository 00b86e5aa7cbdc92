"""A real control plane for the whole e2e session (built on first use; see docs/cluster.md).

Every component's log, the API server's audit log and the controller's log stay in
output/e2e/logs after the session; a failing test's report says so.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
from e2e_helpers import (
    E2E_ROOT,
    LOGS,
    OPERATOR_NAMESPACE,
    OPERATOR_RELEASE,
    ControllerProcess,
    helm,
)

from megdet.cluster import node as real_node_module
from megdet.cluster.control_plane import Cluster


@pytest.fixture(scope="session")
def kube():
    cluster = Cluster(root=E2E_ROOT / "cluster", ports_mode="auto", nodes=4)
    cluster.down()  # what an interrupted earlier session left behind
    shutil.rmtree(LOGS, ignore_errors=True)
    try:
        cluster.up(timeout=300)
    except BaseException:
        cluster.down(keep_logs=LOGS)
        raise
    yield cluster
    cluster.down(keep_logs=LOGS)


@pytest.fixture(scope="session")
def real_node(kube):
    """The session cluster's real node (kubelet, containerd, kube-proxy, CoreDNS;
    megdet.cluster.node), started on first use. One real node runs per machine: while another
    session's holds it, this waits (MEGDET_NODE_WAIT seconds, default 600), then fails with
    whose it is. Pods go on it with ``megdet.cluster.node.pod_placement()``; images built
    elsewhere go into it with ``node.import_image(node.socket, archive)``."""
    deadline = time.monotonic() + float(os.environ.get("MEGDET_NODE_WAIT", "600"))
    while True:
        try:
            kube.start_real_node(timeout=600)
            break
        except real_node_module.MachineBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(5)
    node = real_node_module.RealNode(kube, echo=kube.echo)
    yield node
    node.teardown()


@pytest.fixture(scope="session")
def operator_chart(kube):
    """`helm install megdet-operator charts/megdet-operator`, as a platform team runs it."""
    helm(
        kube,
        "install",
        OPERATOR_RELEASE,
        "charts/megdet-operator",
        "-n",
        OPERATOR_NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout=120s",
    )
    return OPERATOR_RELEASE


@pytest.fixture(scope="session")
def controller(kube, operator_chart, tmp_path_factory):
    proc = ControllerProcess(kube, tmp_path_factory.mktemp("controller"))
    proc.start()
    yield proc
    proc.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and "kube" in item.fixturenames:
        report.sections.append(
            (
                "control plane logs",
                f"every component's log and audit.log: {LOGS} "
                f"(while the session runs: {E2E_ROOT / 'cluster' / 'logs'})",
            )
        )
