"""`megdet doctor`'s RDMA facts: verbs library, providers, devices, memlock, capabilities."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

from megdet.image.doctor import GpuInfo, build_report, format_report
from megdet.image.rdma import (
    CAP_IPC_LOCK,
    decode_capabilities,
    ib_requested,
    probe_rdma,
    rdma_lines,
    rdma_warnings,
)
from megdet.image.topology import topology_from_env

UNLIMITED = resource.RLIM_INFINITY
# CapEff of a process in a container (Docker/containerd default set, 0x00000000a80425fb), with
# and without IPC_LOCK; a non-root process that was "given" IPC_LOCK still shows 0
# (kubernetes/kubernetes#56374).
DEFAULT_CAPS = 0x00000000A80425FB
WITH_IPC_LOCK = DEFAULT_CAPS | 1 << CAP_IPC_LOCK


def fake_system(tmp_path: Path, *, provider: bool = True, devices: bool = True, caps: int = 0):
    """A /usr with Debian/Ubuntu's ibverbs-providers layout, /dev/infiniband, /proc status."""
    usr = tmp_path / "usr"
    prov_dir = usr / "lib/x86_64-linux-gnu/libibverbs"
    prov_dir.mkdir(parents=True)
    (prov_dir / "libmlx4-rdmav34.so").write_bytes(b"")
    if provider:
        (prov_dir / "libmlx5-rdmav34.so").write_bytes(b"")
    dev = tmp_path / "dev-infiniband"
    if devices:
        dev.mkdir()
        for name in ("rdma_cm", "uverbs0"):
            (dev / name).write_bytes(b"")
    status = tmp_path / "status"
    status.write_text(f"Name:\tpython\nUid:\t10001\nCapInh:\t0\nCapEff:\t{caps:016x}\n")
    return {"lib_root": usr, "dev_root": dev, "proc_status": status}


def probe(tmp_path, *, verbs=True, memlock=(UNLIMITED, UNLIMITED), uid=10001, **system):
    return probe_rdma(
        load_library=lambda name: None if verbs else f"{name}: cannot open shared object file",
        getrlimit=lambda _: memlock,
        uid=uid,
        **fake_system(tmp_path, **system),
    )


IB_ON = {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5"}


def test_probe_reads_providers_devices_memlock_and_capeff(tmp_path):
    info = probe(tmp_path, memlock=(65536, 65536), caps=WITH_IPC_LOCK, uid=0)
    assert info.verbs_loadable
    assert set(info.providers) == {"mlx4", "mlx5"}
    assert info.providers["mlx5"].endswith("lib/x86_64-linux-gnu/libibverbs/libmlx5-rdmav34.so")
    assert info.uverbs_devices == ("rdma_cm", "uverbs0")
    assert info.memlock == (65536, 65536) and not info.memlock_unlimited
    assert info.cap_eff == WITH_IPC_LOCK and info.ipc_lock


def test_capabilities_decode_by_bit():
    assert decode_capabilities(1 << CAP_IPC_LOCK) == ["IPC_LOCK"]
    assert decode_capabilities(0) == []
    assert "NET_RAW" in decode_capabilities(DEFAULT_CAPS)
    assert "IPC_LOCK" not in decode_capabilities(DEFAULT_CAPS)


def test_a_working_ib_pod_gets_no_warning_by_either_memlock_route(tmp_path):
    runtime = probe(tmp_path / "a", memlock=(UNLIMITED, UNLIMITED), caps=DEFAULT_CAPS)
    root = probe(tmp_path / "b", memlock=(65536, 65536), caps=WITH_IPC_LOCK, uid=0)
    assert rdma_warnings(runtime, IB_ON) == [] and rdma_warnings(root, IB_ON) == []
    # The doctor says which route holds, so a pod proves the chart's nccl.ib.memlock choice.
    assert "locked memory for RDMA: RLIMIT_MEMLOCK is unlimited" in "\n".join(rdma_lines(runtime))
    assert "locked memory for RDMA: CAP_IPC_LOCK is effective" in "\n".join(rdma_lines(root))


def test_ib_requested_without_user_space_devices_or_memlock_warns_with_each_cause(tmp_path):
    info = probe(
        tmp_path, verbs=False, provider=False, devices=False, memlock=(65536, 65536), caps=0
    )
    [warning] = rdma_warnings(info, IB_ON)
    assert warning.startswith("InfiniBand is requested (NCCL_IB_DISABLE=0 / NCCL_IB_HCA)")
    assert "libibverbs.so.1 cannot be loaded" in warning
    assert "no mlx5 verbs provider" in warning
    assert "/dev/infiniband has no devices" in warning
    assert "RLIMIT_MEMLOCK is 65536 bytes and CAP_IPC_LOCK is not effective (uid 10001)" in warning
    lines = "\n".join(rdma_lines(info))
    assert "libibverbs.so.1: NOT loadable" in lines
    assert "verbs providers: mlx4; mlx5: MISSING" in lines
    assert "locked memory for RDMA: NOT available" in lines


def test_non_root_with_ipc_lock_added_but_not_effective_is_caught(tmp_path):
    # What uid 10001 with capabilities.add [IPC_LOCK] really has: CapEff without IPC_LOCK.
    info = probe(tmp_path, memlock=(8 << 20, 8 << 20), caps=0)
    [warning] = rdma_warnings(info, IB_ON)
    assert "CAP_IPC_LOCK is not effective" in warning and "verbs" not in warning


@pytest.mark.parametrize(
    ("env", "requested"),
    [
        ({"NCCL_IB_DISABLE": "0"}, True),
        ({"NCCL_IB_DISABLE": "1", "NCCL_IB_HCA": "mlx5"}, False),
        ({"NCCL_IB_HCA": "mlx5"}, True),
        ({}, False),
    ],
)
def test_ib_is_requested_by_the_charts_nccl_env(env, requested, tmp_path):
    assert ib_requested(env) is requested
    broken = probe(tmp_path, verbs=False)
    assert bool(rdma_warnings(broken, env)) is requested


def test_doctor_report_carries_the_rdma_section_and_warning(tmp_path):
    info = probe(tmp_path, verbs=False, memlock=(65536, 65536), caps=0)
    topology = topology_from_env({"PET_NPROC_PER_NODE": "1"})
    report = build_report(
        IB_ON,
        topology,
        gpus=GpuInfo("2.14.1", "12.6"),
        rdma=info,
        plan_function=lambda t, a: (_ for _ in ()).throw(ValueError("no plan here")),
    )
    text = format_report(report)
    assert "  RDMA:\n    libibverbs.so.1: NOT loadable" in text
    assert "WARNING: InfiniBand is requested" in text
    quiet = format_report(build_report({}, topology, gpus=GpuInfo("2.14.1", "12.6"), rdma=info))
    assert "InfiniBand is requested" not in quiet


def test_the_real_probe_matches_this_process():
    info = probe_rdma()
    assert info.memlock == resource.getrlimit(resource.RLIMIT_MEMLOCK)
    assert info.uid == os.getuid()
    status = Path("/proc/self/status").read_text()
    cap_eff = next(line for line in status.splitlines() if line.startswith("CapEff:"))
    assert info.cap_eff == int(cap_eff.split()[1], 16)
