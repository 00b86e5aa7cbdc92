"""NCCL's debug log: its line format, NCCL_DEBUG_FILE's placeholders, the launcher's redirect and
the echo of the lines the pod's own level prints (lines built from NCCL's format strings:
tests/nccl_format.py)."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest
from pod_helpers import megdet

from megdet.image.nccl_log import (
    ECHO_ENV,
    LogEcho,
    debug_file_path,
    log_hostname,
    parse_line,
    with_fabric_log,
)
from tests import nccl_format as nf


def test_info_warn_and_version_lines_are_told_apart():
    line = parse_line(nf.info(nf.USING_NETWORK % "IB"))
    assert (line.level, line.message, line.pid) == ("INFO", "Using network IB", nf.PID)
    warn = parse_line(nf.warn("NET/IB : Got async event : port error"))
    assert (warn.level, warn.message) == ("WARN", "NET/IB : Got async event : port error")
    assert parse_line(nf.version_message()).level == "VERSION"  # NCCL_DEBUG=VERSION|WARN
    assert parse_line("[06/11 11:44:19] d2.engine.train_loop INFO: Starting training") is None
    assert parse_line("") is None


def test_a_timestamped_info_line_and_a_plugin_name_with_spaces_parse():
    # NCCL_DEBUG_TIMESTAMP_LEVELS=INFO puts the strftime timestamp before the prefix.
    line = parse_line("[2026-06-11 11:44:19] " + nf.info(nf.USING_NETWORK % "AWS Libfabric"))
    assert (line.level, line.message) == ("INFO", "Using network AWS Libfabric")


def test_debug_file_placeholders_expand_as_nccl_expands_them():
    assert debug_file_path("/tmp/d/nccl.%h.%p", "node-1", 77) == "/tmp/d/nccl.node-1.77"
    assert debug_file_path("a%%b.%x.%", "h", 1) == "a%b.%x.%"


def test_the_hostname_is_cut_at_the_first_dot_and_loses_percent_and_slash():
    assert log_hostname("gpu-3.cluster.local") == "gpu-3"
    assert log_hostname("a%b/c") == "a-b-c"


@pytest.mark.parametrize(
    ("asked", "echo"), [(None, "WARN"), ("WARN", "WARN"), ("version", "VERSION")]
)
def test_quiet_levels_send_init_net_info_to_a_file_per_process(tmp_path, asked, echo):
    env = {"PATH": "/bin"} if asked is None else {"NCCL_DEBUG": asked}
    out, note = with_fabric_log(env, tmp_path / "nccl")
    assert out["NCCL_DEBUG"] == "INFO" and out["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert out["NCCL_DEBUG_FILE"] == f"{tmp_path}/nccl/nccl.%h.%p"
    assert out[ECHO_ENV] == echo and (tmp_path / "nccl").is_dir()
    assert f"{echo}-level lines are copied here" in note


@pytest.mark.parametrize(
    "env",
    [
        {"NCCL_DEBUG": "INFO"},  # the pod asked for INFO in its log: left there
        {"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "COLL"},
        {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "/data/nccl.%h.%p"},  # the pod's own file
    ],
)
def test_a_level_or_file_the_pod_chose_is_kept(tmp_path, env):
    out, note = with_fabric_log(env, tmp_path)
    assert out == env and note is None


def test_a_folder_that_cannot_be_made_leaves_nccl_alone(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out, note = with_fabric_log({"NCCL_DEBUG": "WARN"}, blocker / "nccl")
    assert out == {"NCCL_DEBUG": "WARN"} and "cannot create" in note


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def test_the_echo_prints_warn_and_version_lines_only_and_waits_for_whole_lines(tmp_path):
    old = tmp_path / "nccl.gpu-node-3.1"
    _append(old, nf.warn("from a previous launch"))  # there before: not echoed
    out = io.StringIO()
    echo = LogEcho(tmp_path, "WARN", out)
    rank = tmp_path / "nccl.gpu-node-3.4242"
    _append(rank, nf.info(nf.version_message()) + "".join(nf.socket_fallback_log()[1:]))
    _append(rank, nf.warn("NET/IB : Got async event : port error")[:-20])  # half a line
    assert echo.poll() == 1
    assert out.getvalue() == "NCCL version 2.30.7+cuda13.0\n"
    _append(rank, nf.warn("NET/IB : Got async event : port error")[-20:])
    _append(old, nf.info(nf.USING_NETWORK % "IB"))
    assert echo.poll() == 1
    assert (
        out.getvalue().splitlines()[-1].endswith("NCCL WARN NET/IB : Got async event : port error")
    )


def test_at_version_level_only_the_version_is_echoed(tmp_path):
    out = io.StringIO()
    echo = LogEcho(tmp_path, "VERSION", out)
    _append(tmp_path / "nccl.h.1", nf.info(nf.version_message()) + nf.warn("boom"))
    assert echo.poll() == 1 and out.getvalue() == "NCCL version 2.30.7+cuda13.0\n"


def test_the_echo_thread_prints_lines_while_the_run_goes_on_and_at_stop(tmp_path):
    out = io.StringIO()
    with LogEcho(tmp_path, "WARN", out, interval=0.05):
        _append(tmp_path / "nccl.h.1", nf.warn("first"))
        deadline = time.monotonic() + 10
        while "first" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "NCCL WARN first" in out.getvalue()
        _append(tmp_path / "nccl.h.1", nf.warn("last"))
    assert "NCCL WARN last" in out.getvalue()  # the final poll at stop


def test_launch_dry_run_says_where_nccls_init_lines_go(tmp_path):
    env = {"PET_NPROC_PER_NODE": "1", "TMPDIR": str(tmp_path)}
    result = megdet("launch", "--dry-run", "train", env=env)
    assert result.returncode == 0, result.stderr
    assert f"NCCL's INIT,NET INFO lines go to {tmp_path}/megdet-nccl/nccl.%h.%p" in result.stdout
    result = megdet("launch", "--dry-run", "train", env={**env, "NCCL_DEBUG": "INFO"})
    assert "INFO lines go to" not in result.stdout


def test_launch_echoes_the_warn_lines_the_ranks_nccl_writes(tmp_path, monkeypatch, capsys):
    # The ranks are faked: the launcher's child writes what NCCL would into its file.
    import argparse

    from megdet.image import cli, launcher

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("PET_NPROC_PER_NODE", "1")
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    monkeypatch.setattr(cli, "count_visible_gpus", lambda: 0)
    monkeypatch.setattr("megdet.image.doctor.build_report", lambda *a: None)
    monkeypatch.setattr("megdet.image.doctor.format_report", lambda report: "(doctor)")
    seen = {}

    def fake_child(cmd, env, while_running=None):
        seen.update(env)
        path = debug_file_path(env["NCCL_DEBUG_FILE"], log_hostname(), 999)
        _append(Path(path), "".join(nf.socket_fallback_log()) + nf.warn("NET/IB : boom"))
        return 0

    monkeypatch.setattr(launcher, "run_forwarding_signals", fake_child)
    args = argparse.Namespace(megdet_args=["train"], dry_run=False)
    assert cli.run_launch(args) == 0
    assert seen["NCCL_DEBUG"] == "INFO" and seen[ECHO_ENV] == "WARN"
    out = capsys.readouterr().out
    assert "NCCL WARN NET/IB : boom" in out and "NCCL version 2.30.7+cuda13.0" in out
    assert "Using network" not in out  # INFO lines stay in the file
    assert os.environ.get("NCCL_DEBUG") is None
