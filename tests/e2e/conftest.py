"""A real control plane for the whole e2e session (built on first use; see docs/cluster.md).

Every component's log, the API server's audit log and the controller's log stay in
output/e2e/logs after the session; a failing test's report says so.

The cluster ends once the session's last test that uses it is done, not at the session's end:
the tests collected after tests/e2e (the trainer's multi-process runs among them) get the
cores, the memory and the disk that the control plane and the real node held.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import try_locally
import yaml
from e2e_helpers import (
    E2E_ROOT,
    EXAMPLE,
    LOGS,
    OPERATOR_NAMESPACE,
    OPERATOR_RELEASE,
    ControllerProcess,
    eventually,
    helm,
    pods_of,
)
from node_ahead import Ahead, wanted

from cluster import node as real_node_module
from cluster.control_plane import Cluster
from cluster.local_images import link_clients, load_images
from cluster.node import NODE_NAME

#: How to end what the session fixtures below started, in the order they started it: each
#: with the fixture whose last test it waits for (None: the last test that uses the cluster).
_ENDS: list[tuple[str | None, Callable[[], None]]] = []


def _ending(end: Callable[[], None], after: str | None = None) -> Callable[[], None]:
    """``end``, registered to run when the last test that uses the cluster is done (or, with
    ``after``, the last test that uses that fixture), and run at most once (the fixture's own
    teardown calls it again at the session's end)."""
    done = []

    def once() -> None:
        if not done:
            done.append(True)
            end()

    _ENDS.append((after, once))
    return once


def cluster_tests(items: list[pytest.Item]) -> list[pytest.Item]:
    """The tests of every e2e module in which a test uses the session's cluster (the ``kube``
    fixture, directly or through another fixture): a module's tests stay together (its module
    fixtures; a test that checks what the tests before it recorded). The e2e modules that
    check this suite's own machinery on stand-ins start no cluster and are not among them."""
    here = Path(__file__).parent
    modules = {i.path for i in items if here in i.path.parents and "kube" in i.fixturenames}
    return [item for item in items if item.path in modules]


def _last_e2e_item(session: pytest.Session, fixture: str | None = None) -> pytest.Item | None:
    """The session's last test of :func:`cluster_tests` (with ``fixture``: the last one that
    uses that fixture)."""
    e2e = [
        item
        for item in cluster_tests(session.items)
        if fixture is None or fixture in item.fixturenames
    ]
    return e2e[-1] if e2e else None


#: The pytest-xdist group of every test that uses this machine's one real cluster (`make test`
#: runs ``-n 3 --dist loadgroup``: one worker runs them all, in order, the others the rest).
CLUSTER_GROUP = "real-cluster"


@pytest.hookimpl(tryfirst=True)  # before xdist names the group in the nodeids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put :func:`cluster_tests` in :data:`CLUSTER_GROUP` (xdist gives a group to one
    worker): the session fixtures below start one control plane and take the machine's one
    real node, so two workers running them would start two clusters and wait on each other's
    node. The e2e modules that start no cluster (this suite's own machinery, checked on
    stand-ins) go to any worker, off the cluster worker's long chain."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in cluster_tests(items):
        item.add_marker(pytest.mark.xdist_group(CLUSTER_GROUP))


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the item's module fixtures
def pytest_runtest_teardown(item, nextitem):
    last = item is _last_e2e_item(item.session)
    for after, end in reversed(list(_ENDS)):
        if last or (after is not None and item is _last_e2e_item(item.session, after)):
            _ENDS.remove((after, end))
            end()


#: The real node and the images, readied in the background from the session's start when
#: one of its tests needs them (tests/e2e/node_ahead.py); None before, or when none does.
_AHEAD: Ahead | None = None


@pytest.fixture(scope="session")
def kube(request):
    global _AHEAD
    cluster = Cluster(root=E2E_ROOT / "cluster", ports_mode="auto", nodes=4)
    cluster.down()  # what an interrupted earlier session left behind
    shutil.rmtree(LOGS, ignore_errors=True)
    try:
        cluster.up(timeout=300)
    except BaseException:
        cluster.down(keep_logs=LOGS)
        raise
    work = {"real_node": lambda: _start_real_node(cluster), "train_image": lambda: _images(cluster)}
    steps = wanted(request.session.items, Path(__file__).parent)
    _AHEAD = Ahead({name: work[name] for name in steps}) if steps else None

    def down(ahead: Ahead | None = _AHEAD) -> None:
        if ahead is not None:
            ahead.join()  # nothing starts on a cluster that is going
        cluster.down(keep_logs=LOGS)

    end = _ending(down)
    yield cluster
    end()


def _ahead_or(name: str, work: Callable[[], Any]) -> Any:
    """The result of ``name`` from the session's :data:`_AHEAD`, or of ``work`` done now."""
    return _AHEAD.result(name) if _AHEAD is not None and name in _AHEAD else work()


def _start_real_node(kube: Cluster) -> None:
    deadline = time.monotonic() + float(os.environ.get("MEGDET_NODE_WAIT", "600"))
    while True:
        try:
            kube.start_real_node(timeout=600)
            return
        except real_node_module.MachineBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(5)


@pytest.fixture(scope="session")
def real_node(kube):
    """The session cluster's real node (kubelet, containerd, kube-proxy, CoreDNS;
    cluster.node), started from the session's start when a test needs it (node_ahead.py).
    One real node runs per machine: while another session's holds it, this waits
    (MEGDET_NODE_WAIT seconds, default 600), then fails with whose it is. Pods go on it with
    ``cluster.node.pod_placement()``; images built elsewhere go into it with
    ``node.import_image(node.socket, archive)``."""
    _ahead_or("real_node", lambda: _start_real_node(kube))
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


@pytest.fixture(scope="session")
def train_image(kube, real_node) -> str:
    """The e2e variant of the training image and the controller image (`make suite-images`),
    built (or found, by their inputs' digest) and put into the real node's containerd by what
    `make cluster` runs, from the session's start (node_ahead.py); the README's values name
    the training image."""
    said, names = _ahead_or("train_image", lambda: _images(kube))
    print("\n".join(said))
    image = next(n for n in names if n.startswith("ghcr.io/megdet/megdet:"))
    assert any(line.startswith(("loaded ", "ghcr.io")) and image in line for line in said), said
    # `make cluster` again (or `make cluster-images`) leaves an image the node holds as it is.
    again: list[str] = []
    load_images(kube, ["controller"], echo=again.append)
    assert f"already on {NODE_NAME}" in again[0], again
    link_clients(kube)
    readme = yaml.safe_load((EXAMPLE / "values.yaml").read_text())["image"]
    assert f"{readme['repository']}:{readme['tag']}" == image, "README's values name another image"
    return image


#: The images `train_image` loads: the e2e training image and the controller's.
VARIANTS = ("train-ci", "controller")


def _images(kube: Cluster) -> tuple[list[str], list[str]]:
    """Build (or find) :data:`VARIANTS` and load them into the real node: (what the loading
    said, the image names the node holds from them)."""
    from imagebuild.build import build

    for variant in VARIANTS:
        build(variant)
    said: list[str] = []
    return said, load_images(kube, VARIANTS, echo=said.append, timeout=1800)


#: The operator chart's controller pods.
OPERATOR_PODS = "app.kubernetes.io/name=megdet-operator"


def operator_pods(kube) -> list[dict[str, Any]]:
    """The operator chart's controller pods that are not done (a pod being deleted counts)."""
    return [
        p
        for p in pods_of(kube, OPERATOR_NAMESPACE, OPERATOR_PODS)
        if p["status"].get("phase") not in ("Succeeded", "Failed")
    ]


@pytest.fixture(scope="session")
def controller_pod(kube, real_node, controller, operator_chart, train_image):
    """The operator chart's controller as a real pod on the real node (not the host process the
    other e2e tests use, which is stopped meanwhile): README's `helm upgrade --install` with
    examples/local/operator-values.yaml (what the platform team changes to run the operator on
    the real node: the controller image built here, loaded by `train_image` as `make cluster`
    loads it, placement on the node, the node's taint among the keys runs may tolerate); rolled
    back after the last test that uses it (one install for the real-training module and the
    shared run, which run one after the other). Kueue starts first: the controller watches
    Kueue's Workloads only where Kueue runs when it starts, and the shared run is queued."""
    install = try_locally.paragraphs()["operator"][0]
    assert install.startswith(f"helm upgrade --install {operator_chart} charts/megdet-operator ")
    history = json.loads(
        helm(kube, "history", operator_chart, "-n", OPERATOR_NAMESPACE, "-o", "json").stdout
    )
    revision = history[-1]["revision"]
    kube.start_kueue()
    controller.stop()

    def roll_back() -> None:
        # The controller's pod goes first, and is waited for: `helm rollback --wait` returns
        # once the old revision's pods are ready, while this one may still be terminating (its
        # 30 s grace period), writing run status beside the host controller started next.
        try:
            kube.kubectl(
                "scale", "deployment", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_PODS,
                "--replicas=0",
            )  # fmt: skip
            eventually(
                lambda: not operator_pods(kube), timeout=300, message="the controller's pods gone"
            )
            helm(
                kube, "rollback", operator_chart, str(revision), "-n", OPERATOR_NAMESPACE,
                "--wait", "--timeout=300s", timeout=360, check=False,
            )  # fmt: skip
            kube.kubectl(
                "label", "namespace", OPERATOR_NAMESPACE, "pod-security.kubernetes.io/enforce-",
                check=False,
            )  # fmt: skip
        finally:
            controller.start()
        on_the_node = [p["metadata"]["name"] for p in operator_pods(kube)
                       if p["spec"].get("nodeName") == NODE_NAME]  # fmt: skip
        assert not on_the_node, f"a controller pod still runs on the real node: {on_the_node}"

    # The controller's pod is admitted under `restricted` too (the label applies to new pods).
    kube.kubectl(
        "label", "namespace", OPERATOR_NAMESPACE, "pod-security.kubernetes.io/enforce=restricted"
    )
    try:
        try_locally.run(install, kube.root, timeout=420)
        pod = next(p for p in operator_pods(kube) if p["spec"].get("nodeName") == NODE_NAME)
    except BaseException:
        roll_back()
        raise
    end = _ending(roll_back, after="controller_pod")
    yield pod
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
