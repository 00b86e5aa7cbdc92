"""The fabric report: which network each rank's NCCL uses, read from NCCL's init log lines made
with NCCL's own format strings (tests/nccl_format.py); gloo runs say they are not NCCL."""

from __future__ import annotations

import logging

import pytest

from megdet.fabric_report import FabricReport, from_metrics
from megdet.image.nccl_log import debug_file_path, log_hostname
from megdet.trainer.fabric import (
    ANY,
    GLOO,
    IB,
    NONE,
    SOCKET,
    UNKNOWN,
    Fabric,
    fabric_from_lines,
    read_fabric,
    report_fabric,
    requested_fabric,
    run_report,
    summarize,
)
from tests import nccl_format as nf

INFO_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def test_infiniband_in_use_is_ib_with_its_ports_and_link_layer():
    fabric = fabric_from_lines(nf.ib_log(), requested=IB)
    assert (fabric.transport, fabric.degraded) == (IB, False)
    assert fabric.detail == "mlx5_0:1/IB, mlx5_1:1/IB"


def test_roce_is_nccls_ib_network_and_says_roce():
    lines = [nf.info(nf.ib_using([("mlx5_2", 1, "RoCE")])), nf.info(nf.USING_NETWORK % "IB")]
    assert fabric_from_lines(lines, IB).detail == "mlx5_2:1/RoCE"


def test_socket_fallback_when_infiniband_was_requested_is_degraded_with_nccls_reason():
    fabric = fabric_from_lines(nf.socket_fallback_log(), requested=IB, rank=5)
    assert (fabric.transport, fabric.degraded) == (SOCKET, True)
    assert fabric.detail == "eth0:10.0.0.3<0>"
    assert fabric.notes == ("NET/IB : No device found.", "Failed to initialize NET plugin IB")
    text = fabric.describe()
    assert text.startswith("rank 5: NCCL network Socket (eth0:10.0.0.3<0>)")
    assert "InfiniBand was requested" in text and "NET/IB : No device found." in text


@pytest.mark.parametrize("requested", [SOCKET, ANY])
def test_sockets_are_not_degraded_when_infiniband_was_not_requested(requested):
    assert not fabric_from_lines(nf.socket_fallback_log(), requested).degraded


def test_an_external_plugin_is_reported_by_its_own_name():
    name = "AWS Libfabric"
    lines = [nf.info(nf.PLUGIN_INITIALIZED % name), nf.info(nf.USING_NETWORK % name)]
    fabric = fabric_from_lines(lines, IB)
    assert (fabric.transport, fabric.degraded) == (name, False)


def test_only_this_processs_lines_count_and_communicators_on_two_networks_are_both_named():
    lines = nf.socket_fallback_log(pid=7) + nf.ib_log(pid=8)
    assert fabric_from_lines(lines, IB, pid=8).transport == IB
    assert fabric_from_lines(lines, IB).transport == "Socket+IB"


def test_a_warn_line_is_kept_as_a_note():
    lines = [nf.warn("NET/IB : mlx5_0:1 Got fatal async event: port error")]
    lines += nf.socket_fallback_log()
    assert fabric_from_lines(lines, IB).notes[0].endswith("Got fatal async event: port error")


def test_no_using_network_line_is_unknown_not_a_guess():
    fabric = fabric_from_lines([nf.info(nf.ib_using([("mlx5_0", 1, "IB")]))], IB)
    assert fabric.transport == UNKNOWN and "no 'Using network' line" in fabric.detail


@pytest.mark.parametrize(
    ("env", "requested"),
    [
        ({"NCCL_IB_DISABLE": "0"}, IB),  # the run chart's nccl.ib.enabled
        ({"NCCL_IB_HCA": "=mlx5_0:1"}, IB),
        ({"NCCL_IB_DISABLE": "1"}, SOCKET),  # nccl.ib.enabled false
        ({}, ANY),
    ],
)
def test_what_the_env_requests(env, requested):
    assert requested_fabric(env) == requested


def _write_rank_log(tmp_path, pid: int, lines: list[str]) -> dict[str, str]:
    pattern = str(tmp_path / "nccl.%h.%p")
    path = debug_file_path(pattern, log_hostname(), pid)
    with open(path, "w") as f:
        f.write("".join(lines))
    return {**INFO_ENV, "NCCL_DEBUG_FILE": pattern, "NCCL_IB_DISABLE": "0"}


def test_a_rank_reads_its_own_nccl_file(tmp_path):
    env = _write_rank_log(tmp_path, 4242, nf.socket_fallback_log(pid=4242))
    fabric = read_fabric("nccl", 16, rank=3, env=env, pid=4242)
    assert (fabric.transport, fabric.requested, fabric.rank, fabric.degraded) == (
        SOCKET,
        IB,
        3,
        True,
    )


@pytest.mark.parametrize(
    ("env", "why"),
    [
        (INFO_ENV, "NCCL_DEBUG_FILE unset"),
        ({"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "/x/%p"}, "NCCL_DEBUG=WARN prints no INFO"),
        ({**INFO_ENV, "NCCL_DEBUG_SUBSYS": "COLL", "NCCL_DEBUG_FILE": "/x/%p"}, "lacks INIT"),
        ({**INFO_ENV, "NCCL_DEBUG_SUBSYS": "^INIT", "NCCL_DEBUG_FILE": "/x/%p"}, "excludes INIT"),
        ({**INFO_ENV, "NCCL_DEBUG_FILE": "/nonexistent/nccl.%p"}, "cannot read /nonexistent/"),
    ],
)
def test_a_log_that_cannot_be_read_is_unknown_and_says_why(env, why):
    fabric = read_fabric("nccl", 2, env=env, pid=1)
    assert fabric.transport == UNKNOWN and why in fabric.detail


def test_the_default_subsystems_include_init(tmp_path):
    env = _write_rank_log(tmp_path, 9, nf.ib_log(pid=9))
    del env["NCCL_DEBUG_SUBSYS"]
    assert read_fabric("nccl", 2, env=env, pid=9).transport == IB


def test_gloo_says_plainly_it_is_not_nccl_and_one_process_has_no_fabric():
    gloo = read_fabric("gloo", 2, rank=1, env={})
    assert gloo.transport == GLOO and gloo.describe().startswith("rank 1: gloo (not NCCL)")
    assert summarize([gloo, read_fabric("gloo", 2, env={})])[0] == (
        "Fabric: ranks 0-1 on gloo (not NCCL)"
    )
    assert read_fabric("nccl", 1, env={}).transport == NONE
    assert read_fabric(None, 1, env={}).transport == NONE


def test_the_summary_names_the_degraded_ranks_and_the_cause():
    fabrics = [Fabric(IB, IB, rank=r) for r in range(4)]
    fabrics += [fabric_from_lines(nf.socket_fallback_log(), IB, rank=r) for r in (4, 5, 7)]
    text, degraded = summarize(fabrics)
    assert degraded
    assert text.startswith("Fabric: ranks 0-3 on IB; ranks 4,5,7 on Socket. DEGRADED: ranks 4,5,7")
    assert "NET/IB : No device found." in text


def test_report_fabric_exports_the_info_gauge_and_logs_the_run(caplog):
    from prometheus_client import CollectorRegistry, generate_latest

    from megdet.trainer.metrics import TrainerMetrics

    registry = CollectorRegistry()
    # caplog's handler on the logger itself: detectron2's setup_logger (run by earlier tests in
    # this process) turns the "megdet" logger's propagation off, so the root never sees it.
    logger = logging.getLogger("megdet.trainer.fabric")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="megdet.trainer.fabric"):
            fabrics = report_fabric(TrainerMetrics(registry))
    finally:
        logger.removeHandler(caplog.handler)
    assert [f.transport for f in fabrics] == [NONE]  # this test process: no process group
    text = generate_latest(registry).decode()
    assert 'megdet_train_fabric_info{rank="0",requested=' in text
    assert "Fabric: rank 0 on none" in caplog.text


def test_the_runs_report_counts_the_degraded_ranks_and_keeps_nccls_reason():
    fabrics = [Fabric(IB, IB, rank=0), fabric_from_lines(nf.socket_fallback_log(), IB, rank=1)]
    report = run_report(fabrics)
    assert report == FabricReport("IB,Socket", IB, 2, 1, "NET/IB : No device found.")
    assert run_report([read_fabric("gloo", 2, r, env={}) for r in (0, 1)]) == FabricReport(
        "gloo", ANY, 2
    )


def test_the_progress_reporter_sends_the_runs_fabric():
    from types import SimpleNamespace

    from megdet.progress import to_request
    from megdet.trainer.progress_reporter import ProgressReporter

    plan = SimpleNamespace(max_iter=10, global_batch=4, images_at=lambda i: 4 * i)
    report = FabricReport("Socket", IB, 2, 2, "NET/IB : No device found.")
    reporter = ProgressReporter(poster=None, plan=plan, fabric=report)
    metrics = to_request(reporter.snapshot())["trainerStatus"]["metrics"]
    assert from_metrics(metrics) == report
