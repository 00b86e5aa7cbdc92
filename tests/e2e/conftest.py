"""A real control plane for the whole e2e session (built on first use; see docs/cluster.md).

Every component's log, the API server's audit log and the controller's log stay in
output/e2e/logs after the session; a failing test's report says so.

The cluster ends once the session's last e2e test is done, not at the session's end: the tests
collected after tests/e2e (the trainer's multi-process runs among them) get the cores, the
memory and the disk that the control plane and the real node held.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e_helpers import (
    E2E_ROOT,
    LOGS,
    OPERATOR_NAMESPACE,
    OPERATOR_RELEASE,
    ControllerProcess,
    helm,
)

from cluster import node as real_node_module
from cluster.control_plane import Cluster

#: How to end what the session fixtures below started, in the order they started it.
_ENDS: list[Callable[[], None]] = []


def _ending(end: Callable[[], None]) -> Callable[[], None]:
    """``end``, registered to run when the last e2e test is done, and run at most once (the
    fixture's own teardown calls it again at the session's end)."""
    done = []

    def once() -> None:
        if not done:
            done.append(True)
            end()

    _ENDS.append(once)
    return once


def _last_e2e_item(session: pytest.Session) -> pytest.Item | None:
    here = Path(__file__).parent
    e2e = [item for item in session.items if here in item.path.parents]
    return e2e[-1] if e2e else None


#: The pytest-xdist group of every test that uses this machine's one real cluster (`make test`
#: runs ``-n 2 --dist loadgroup``: one worker runs them all, in order, the other the rest).
CLUSTER_GROUP = "real-cluster"


@pytest.hookimpl(tryfirst=True)  # before xdist names the group in the nodeids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put every e2e test in :data:`CLUSTER_GROUP` (xdist gives a group to one worker): the
    session fixtures below start one control plane and take the machine's one real node, so
    two workers running e2e tests would start two clusters and wait on each other's node."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.xdist_group(CLUSTER_GROUP))


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the item's module fixtures
def pytest_runtest_teardown(item, nextitem):
    if item is not _last_e2e_item(item.session):
        return
    while _ENDS:
        _ENDS.pop()()


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
    end = _ending(lambda: cluster.down(keep_logs=LOGS))
    yield cluster
    end()


@pytest.fixture(scope="session")
def real_node(kube):
    """The session cluster's real node (kubelet, containerd, kube-proxy, CoreDNS;
    cluster.node), started on first use. One real node runs per machine: while another
    session's holds it, this waits (MEGDET_NODE_WAIT seconds, default 600), then fails with
    whose it is. Pods go on it with ``cluster.node.pod_placement()``; images built
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
    end = _ending(node.teardown)
    yield node
    end()


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
    end = _ending(proc.stop)
    yield proc
    end()


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
