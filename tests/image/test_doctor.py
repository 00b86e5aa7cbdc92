"""`megdet doctor` on this machine, and the pieces of its report."""

from __future__ import annotations

import subprocess

import pytest
from pod_helpers import megdet

from megdet.image.doctor import (
    SHM_WARN_BYTES,
    Detectron2Info,
    GpuInfo,
    _parse_trainer_command,
    arch_covers,
    build_report,
    format_report,
    infiniband_devices,
    probe_detectron2,
    shm_bytes,
    shm_warning,
)
from megdet.image.topology import topology_from_env
from megdet.plan import plan_run


@pytest.fixture(scope="module")
def doctor_here() -> subprocess.CompletedProcess:
    return megdet("doctor")


def test_doctor_runs_here_and_reports_no_gpu(doctor_here):
    assert doctor_here.returncode == 0, doctor_here.stderr
    assert "no GPU visible" in doctor_here.stdout
    assert "Traceback" not in doctor_here.stderr


def test_doctor_reports_the_real_shm_size(doctor_here):
    size = shm_bytes("/dev/shm")
    assert size is not None and size > 0
    assert f"/dev/shm:\n    size {size / (1 << 30):.2f} GiB ({size} bytes)" in doctor_here.stdout


def test_doctor_reports_world_size_and_plan_from_the_env():
    env = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1"}
    result = megdet("doctor", env={**env, "PET_NPROC_PER_NODE": "3"})
    assert result.returncode == 0, result.stderr
    assert "world size 6" in result.stdout
    assert "this node's rank 1" in result.stdout
    assert "--rdzv-endpoint=127.0.0.1:29500" in result.stdout
    expected = plan_run({"gpus": 6, "gpus_per_node": 3})
    assert f"global batch {expected.global_batch}, lr {expected.lr:.6g}" in result.stdout


@pytest.mark.parametrize(
    ("env", "variable"),
    [({"PET_NNODES": "abc"}, "PET_NNODES"), ({"PET_NPROC_PER_NODE": "lots"}, "PET_NPROC_PER_NODE")],
)
def test_doctor_with_malformed_env_exits_2_naming_the_variable(env, variable):
    result = megdet("doctor", env=env)
    assert result.returncode == 2
    assert variable in result.stderr
    assert "Traceback" not in result.stderr


def test_shm_below_one_gib_warns_and_above_does_not():
    assert "Bus error" in shm_warning(64 << 20)
    assert shm_warning(SHM_WARN_BYTES) is None


def test_missing_shm_is_a_warning_not_a_crash(tmp_path):
    topology = topology_from_env({}, visible_gpus=0)
    report = build_report(
        {}, topology, gpus=GpuInfo("x", None), shm_path=str(tmp_path / "absent"),
        infiniband_root=tmp_path,
    )  # fmt: skip
    assert any("missing" in w for w in report.warnings)


def test_infiniband_devices_and_port_states_are_listed(tmp_path):
    # The sysfs layout the kernel uses for RDMA devices.
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    assert infiniband_devices(tmp_path) == {"mlx5_0": ["1: 4: ACTIVE"]}
    assert infiniband_devices(tmp_path / "none") == {}


def test_report_shows_gpus_nccl_and_the_nccl_env(tmp_path):
    topology = topology_from_env({"PET_NPROC_PER_NODE": "gpu"}, visible_gpus=2)
    report = build_report(
        {"NCCL_IB_HCA": "mlx5", "TORCH_NCCL_BLOCKING_WAIT": "0", "HOME": "/x"},
        topology,
        gpus=GpuInfo("2.14.1", "12.6", ("NVIDIA H100", "NVIDIA H100"), "2.27.5"),
        infiniband_root=tmp_path,
    )
    text = format_report(report)
    assert "2 visible GPU(s)" in text and "cuda:1 NVIDIA H100" in text
    assert "NCCL: 2.27.5" in text
    assert "NCCL_IB_HCA=mlx5" in text and "TORCH_NCCL_BLOCKING_WAIT=0" in text
    assert "HOME=" not in text


def test_doctor_plans_with_the_trainer_config_when_given(tmp_path):
    from megdet.trainer.config import load_config, spec_from_config

    topology = topology_from_env({"PET_NPROC_PER_NODE": "2"}, visible_gpus=0)
    args = ["train", "--config", "megdet_tiny_cpu.yaml", "MEGDET.IMAGES_PER_GPU", "3"]
    report = build_report({}, topology, args, gpus=GpuInfo("x", None), infiniband_root=tmp_path)
    cfg = load_config("megdet_tiny_cpu.yaml", ["MEGDET.IMAGES_PER_GPU", "3"])
    expected = plan_run(spec_from_config(cfg, 2, 2))
    text = format_report(report)
    assert "from config megdet_tiny_cpu.yaml + overrides" in text
    assert f"global batch {expected.global_batch}, lr {expected.lr:.6g}" in text
    assert expected.global_batch == 6


def test_doctor_help_does_not_need_a_gpu_or_env():
    result = megdet("doctor", "--help")
    assert result.returncode == 0
    assert "InfiniBand" in result.stdout


def test_training_command_is_read_with_the_trainers_own_parser():
    args = ["train", "--config", "c.yaml", "--no-resume", "--num-workers", "2", "MEGDET.SYNC_BN",
            "all"]  # fmt: skip
    assert _parse_trainer_command(args) == ("c.yaml", ["MEGDET.SYNC_BN", "all"])
    assert _parse_trainer_command(["plan", "--gpus", "8"]) is None


@pytest.mark.parametrize(
    ("archs", "capability", "covered"),
    [
        (["sm_80"], "8.0", True),
        (["sm_80"], "8.6", True),  # a cubin runs on a newer minor of its major
        (["sm_80"], "9.0", False),  # ...not on another major
        (["sm_86"], "8.0", False),  # ...nor on an older minor
        (["sm_75", "compute_90"], "12.0", True),  # PTX JIT-compiles for newer GPUs
        (["compute_90"], "8.0", False),
        (["7.5", "8.0", "9.0+PTX"], "7.0", False),  # V100 and a CUDA 13 image
        (["7.0", "8.0", "9.0+PTX"], "7.0", True),
        (["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], "8.9", True),  # L4 on 8.6
    ],
)
def test_arch_covers(archs, capability, covered):
    assert arch_covers(archs, capability) is covered


TORCH_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")


def test_without_a_gpu_doctor_says_what_it_would_check(tmp_path):
    topology = topology_from_env({}, visible_gpus=0)
    d2 = Detectron2Info("0.6", "repo@c", "cuda", "13.0", ("8.0", "9.0+PTX"))
    report = build_report(
        {}, topology, gpus=GpuInfo("2.14.1", "13.0", torch_archs=TORCH_ARCHS),
        infiniband_root=tmp_path, detectron2=lambda: d2,
    )  # fmt: skip
    text = format_report(report)
    assert "on a GPU this checks its compute capability against torch's kernels" in text
    assert "(sm_75 sm_80 sm_86 sm_90 sm_100 sm_120)" in text
    assert "detectron2's CUDA ops (8.0;9.0+PTX)" in text
    assert "compiled ops: C++ and CUDA (compiled with CUDA 13.0 for 8.0;9.0+PTX)" in text
    assert not [w for w in report.warnings if "compute" in w]


def test_a_gpu_that_torch_or_detectron2_has_no_code_for_is_a_warning(tmp_path):
    topology = topology_from_env({}, visible_gpus=2)
    gpus = GpuInfo("2.14.1", "13.0", ("Tesla V100", "H100"), "2.28", ("7.0", "9.0"), TORCH_ARCHS)
    d2 = Detectron2Info("0.6", "repo@c", "cuda", "13.0", ("8.0",))
    report = build_report({}, topology, gpus=gpus, infiniband_root=tmp_path, detectron2=lambda: d2)
    text = format_report(report)
    assert "cuda:0 compute 7.0: torch has NO kernels for it; detectron2's ops have NO code" in text
    assert "cuda:1 compute 9.0: torch has kernels for it; detectron2's ops have NO code" in text
    warnings = " ".join(report.warnings)
    assert "cuda:0 (compute 7.0) is not among torch's archs" in warnings
    assert "cuda:1 (compute 9.0) is not among detectron2's ops' archs (8.0)" in warnings
    assert "cuda:1 (compute 9.0) is not among torch's archs" not in warnings


def test_detectron2_without_compiled_ops_says_what_is_missing(tmp_path):
    topology = topology_from_env({}, visible_gpus=0)
    d2 = Detectron2Info("0.7.2", "sal-detectron2==0.7.2", "none")
    text = format_report(
        build_report({}, topology, gpus=GpuInfo("x", None), infiniband_root=tmp_path,
                     detectron2=lambda: d2)
    )  # fmt: skip
    assert "detectron2 0.7.2 from sal-detectron2==0.7.2" in text
    assert "compiled ops: none (no _C: NMS and ROIAlign from torchvision" in text


def test_doctor_here_reports_the_installed_detectron2(doctor_here):
    info = probe_detectron2()
    assert info is not None
    assert f"detectron2 {info.version} from {info.source}" in doctor_here.stdout
