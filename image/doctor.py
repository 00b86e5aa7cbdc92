"""`megdet doctor`: what this pod sees, printed before training starts.

The checks answer the questions a failed multi-node start raises: are the GPUs visible, which
NCCL is this, is InfiniBand there and usable from this process (verbs library, provider,
devices, locked memory: :mod:`megdet.image.rdma`), is /dev/shm big enough for DataLoader
workers, which NCCL settings are in effect, and what will the run do at this world size. Only
a malformed launch env is fatal (the launcher could not start torchrun correctly anyway);
everything else is reported, with warnings, and left to the operator.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from megdet import __version__
from megdet.image.nccl import nccl_env
from megdet.image.rdma import RdmaInfo, probe_rdma, rdma_lines, rdma_warnings
from megdet.image.topology import (
    TORCHRUN_DEFAULT_SHUTDOWN_TIMEOUT,
    LaunchTopology,
    torchrun_arguments,
)
from megdet.plan import Plan, SpecError, plan_run

__all__ = [
    "SHM_WARN_BYTES",
    "Detectron2Info",
    "GpuInfo",
    "Report",
    "arch_covers",
    "build_report",
    "format_report",
    "infiniband_devices",
    "probe_detectron2",
    "probe_gpus",
    "shm_bytes",
    "shm_warning",
]

#: Below this, DataLoader workers die with "Bus error" on real images (Docker's default is 64 MiB).
SHM_WARN_BYTES = 1 << 30

#: Where the kernel lists RDMA devices (InfiniBand and RoCE).
INFINIBAND_SYSFS = Path("/sys/class/infiniband")


@dataclass(frozen=True)
class GpuInfo:
    """What torch reports about the accelerators in this pod."""

    torch_version: str | None  # None: torch is not installed (the controller image)
    cuda_version: str | None
    names: tuple[str, ...] = ()
    nccl_version: str | None = None
    capabilities: tuple[str, ...] = ()  # per visible GPU, e.g. "9.0"
    torch_archs: tuple[str, ...] = ()  # what torch has kernels for, e.g. "sm_90", "compute_120"

    @property
    def count(self) -> int:
        return len(self.names)


def probe_gpus() -> GpuInfo:
    """Visible GPUs and the NCCL version, from torch (imported here, not at module import)."""
    try:
        import torch
    except ImportError:
        return GpuInfo(torch_version=None, cuda_version=None)
    names: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    nccl = None
    # The archs torch was compiled for, known without a GPU (get_arch_list() needs one).
    flags = getattr(torch._C, "_cuda_getArchFlags", lambda: "")() if torch.version.cuda else ""
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        names = tuple(torch.cuda.get_device_name(i) for i in range(count))
        capabilities = tuple(
            "{}.{}".format(*torch.cuda.get_device_capability(i)) for i in range(count)
        )
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except (RuntimeError, AttributeError):  # a build without NCCL
            nccl = None
    return GpuInfo(
        torch.__version__, torch.version.cuda, names, nccl, capabilities, tuple(flags.split())
    )


def _arch(entry: str) -> tuple[int, int, bool]:
    """(major, minor, is_ptx) of "sm_80", "compute_90", "8.0" or "9.0+PTX"."""
    ptx = entry.startswith("compute_") or entry.endswith("+PTX")
    digits = entry.removesuffix("+PTX").removeprefix("sm_").removeprefix("compute_")
    if "." in digits:
        major, minor = digits.split(".")
    else:
        major, minor = digits[:-1], digits[-1]
    return int(major), int(minor), ptx


def arch_covers(archs: Sequence[str], capability: str) -> bool:
    """Whether code built for ``archs`` runs on a GPU of compute ``capability`` (e.g. "8.6").

    A cubin runs on GPUs of the same major version and an equal or higher minor (sm_80 on an
    8.6 or 8.9 GPU); PTX is JIT-compiled by the driver for any equal or newer GPU.
    """
    major, minor, _ = _arch(capability)
    for entry in archs:
        a_major, a_minor, ptx = _arch(entry)
        if ptx and (a_major, a_minor) <= (major, minor):
            return True
        if not ptx and a_major == major and a_minor <= minor:
            return True
    return False


@dataclass(frozen=True)
class Detectron2Info:
    """Which detectron2 is installed and what its compiled ops (``detectron2._C``) can do."""

    version: str
    source: str  # from the install's marker file, e.g. "sal-detectron2==0.7.2"
    ops: str  # "none", "cpu" or "cuda"
    ops_cuda: str | None = None  # the CUDA version the ops were compiled with
    archs: tuple[str, ...] = ()  # TORCH_CUDA_ARCH_LIST of a CUDA build, e.g. ("8.0", "9.0+PTX")


def probe_detectron2() -> Detectron2Info | None:
    """The installed detectron2 (None: not installed); imports it and its extension."""
    try:
        import detectron2
    except ImportError:
        return None
    folder = Path(detectron2.__file__).parent
    marker = folder / ".megdet-source"
    source = marker.read_text().strip() if marker.is_file() else "unknown (no .megdet-source)"
    archs: tuple[str, ...] = ()
    if " archs=" in source:
        source, _, arch_text = source.partition(" archs=")
        archs = tuple(a for a in arch_text.split(";") if a)
    try:
        from detectron2 import _C
    except ImportError:
        return Detectron2Info(detectron2.__version__, source, "none")
    if _C.has_cuda():
        cuda = str(_C.get_cuda_version()).removeprefix("CUDA ")  # it says "CUDA 13.0"
        return Detectron2Info(detectron2.__version__, source, "cuda", cuda, archs)
    return Detectron2Info(detectron2.__version__, source, "cpu")


def detectron2_lines(info: Detectron2Info | None) -> list[str]:
    if info is None:
        return ["not installed"]
    ops = {
        "none": "none (no _C: NMS and ROIAlign from torchvision, CPU and CUDA; no rotated "
        "boxes, no deformable convolution)",
        "cpu": "C++ only (CPU kernels; its rotated-box and deformable ops have no CUDA kernels, "
        "NMS and ROIAlign on GPUs come from torchvision)",
        "cuda": f"C++ and CUDA (compiled with CUDA {info.ops_cuda}"
        + (f" for {';'.join(info.archs)})" if info.archs else ")"),
    }[info.ops]
    return [f"detectron2 {info.version} from {info.source}", f"compiled ops: {ops}"]


def gpu_arch_lines(gpus: GpuInfo, detectron2: Detectron2Info | None) -> tuple[list[str], list[str]]:
    """Per GPU: does torch (and detectron2's CUDA ops) have code for it? (lines, warnings)."""
    d2_archs = detectron2.archs if detectron2 is not None and detectron2.ops == "cuda" else ()
    if not gpus.count:
        torch_archs = " ".join(gpus.torch_archs) or "none: a CPU build"
        line = (
            f"on a GPU this checks its compute capability against torch's kernels ({torch_archs})"
        )
        if d2_archs:
            line += f" and detectron2's CUDA ops ({';'.join(d2_archs)})"
        return [line + ", and NCCL's version"], []
    lines, warnings = [], []
    for i, cap in enumerate(gpus.capabilities):
        ok_torch = arch_covers(gpus.torch_archs, cap)
        text = f"cuda:{i} compute {cap}: torch {'has' if ok_torch else 'has NO'} kernels for it"
        if not ok_torch:
            warnings.append(
                f"cuda:{i} (compute {cap}) is not among torch's archs "
                f"({' '.join(gpus.torch_archs)}): use an image built for this GPU"
            )
        if d2_archs:
            ok_d2 = arch_covers(d2_archs, cap)
            text += f"; detectron2's ops {'have' if ok_d2 else 'have NO'} code for it"
            if not ok_d2:
                warnings.append(
                    f"cuda:{i} (compute {cap}) is not among detectron2's ops' archs "
                    f"({';'.join(d2_archs)}): rebuild with TORCH_CUDA_ARCH_LIST including it"
                )
        lines.append(text)
    return lines, warnings


def infiniband_devices(root: Path = INFINIBAND_SYSFS) -> dict[str, list[str]]:
    """RDMA devices and their port states, e.g. {"mlx5_0": ["1: 4: ACTIVE"]}; {} if none."""
    if not root.is_dir():
        return {}
    devices: dict[str, list[str]] = {}
    for dev in sorted(root.iterdir()):
        ports = []
        for port in sorted((dev / "ports").glob("*")):
            try:
                state = (port / "state").read_text().strip()
            except OSError:
                state = "unknown"
            ports.append(f"{port.name}: {state}")
        devices[dev.name] = ports
    return devices


def shm_bytes(path: str = "/dev/shm") -> int | None:
    """The size of the shared-memory filesystem, or None when there is none."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def shm_warning(size: int) -> str | None:
    """A warning when /dev/shm is smaller than SHM_WARN_BYTES, else None."""
    if size >= SHM_WARN_BYTES:
        return None
    return (
        f"/dev/shm is {_gib(size)}, below {_gib(SHM_WARN_BYTES)}: DataLoader workers may die "
        "with 'Bus error'; mount a memory-backed emptyDir at /dev/shm"
    )


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


@dataclass
class Report:
    """The diagnostic, as (title, lines) sections plus warnings."""

    sections: list[tuple[str, list[str]]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


PlanFunction = Callable[[LaunchTopology, Sequence[str]], tuple[Plan, str]]


def default_plan(topology: LaunchTopology, megdet_args: Sequence[str]) -> tuple[Plan, str]:
    """The plan the trainer will make at this world size, and where its numbers came from.

    For a ``train``/``eval`` command line and the trainer installed, the config and overrides
    are read with the trainer's own parser and loader; otherwise RunSpec's defaults are planned.
    """
    parsed = _parse_trainer_command(megdet_args)
    if parsed is not None:
        from megdet.trainer.config import load_config, spec_from_config

        config, overrides = parsed
        cfg = load_config(config, overrides)
        spec = spec_from_config(cfg, topology.world_size, topology.nproc_per_node)
        return plan_run(spec), f"config {config}" + (" + overrides" if overrides else "")
    spec = {"gpus": topology.world_size, "gpus_per_node": topology.nproc_per_node}
    return plan_run(spec), "RunSpec defaults (no train/eval --config given)"


def _parse_trainer_command(args: Sequence[str]) -> tuple[str, list[str]] | None:
    """``--config`` and the ``KEY VALUE`` overrides of a train/eval command, or None."""
    if not args or args[0] not in ("train", "eval"):
        return None
    try:
        from megdet.trainer import cli as trainer_cli
    except ImportError:  # an install without the trainer (the controller image)
        return None
    parser = argparse.ArgumentParser(prog="megdet", add_help=False)
    trainer_cli.register(parser.add_subparsers(dest="command"))
    try:
        ns = parser.parse_args(list(args))
    except SystemExit:
        # argparse already printed why; the trainer will refuse the same arguments.
        raise ValueError(f"the command `{shlex.join(args)}` is not valid (see above)") from None
    return ns.config, list(ns.opts or [])


def build_report(
    env: Mapping[str, str],
    topology: LaunchTopology,
    megdet_args: Sequence[str] = (),
    *,
    gpus: GpuInfo | None = None,
    shm_path: str = "/dev/shm",
    infiniband_root: Path = INFINIBAND_SYSFS,
    plan_function: PlanFunction = default_plan,
    rdma: RdmaInfo | None = None,
    detectron2: Callable[[], Detectron2Info | None] | None = None,
) -> Report:
    """Collect the diagnostic for this pod (``gpus``, ``rdma``: injected facts, else probed
    here; ``detectron2``: what finds the installed detectron2, default
    :func:`probe_detectron2`)."""
    report = Report()
    gpus = gpus if gpus is not None else probe_gpus()
    rdma = rdma if rdma is not None else probe_rdma()
    d2 = (detectron2 or probe_detectron2)() if gpus.torch_version is not None else None

    software = [f"megdet {__version__}, Python {platform.python_version()}"]
    if gpus.torch_version is None:
        software.append("torch: not installed (this image cannot train)")
        report.warnings.append("torch is not installed")
    else:
        software.append(f"torch {gpus.torch_version} (CUDA {gpus.cuda_version or 'none'})")
        software.append(f"NCCL: {gpus.nccl_version or 'not available (no CUDA device)'}")
    report.sections.append(("software", software))

    if gpus.count:
        gpu_lines = [f"{gpus.count} visible GPU(s)"]
        gpu_lines += [f"  cuda:{i} {name}" for i, name in enumerate(gpus.names)]
    else:
        gpu_lines = ["no GPU visible (training runs on the CPU with the gloo backend)"]
    if gpus.torch_version is not None:
        arch_lines, arch_warnings = gpu_arch_lines(gpus, d2)
        gpu_lines += arch_lines
        report.warnings += arch_warnings
    report.sections.append(("GPUs", gpu_lines))
    if gpus.torch_version is not None:
        report.sections.append(("detectron2", detectron2_lines(d2)))
    if gpus.count and topology.nproc_per_node > gpus.count:
        report.warnings.append(
            f"{topology.nproc_per_node} processes per node but only {gpus.count} GPU(s) visible"
        )

    ib = infiniband_devices(infiniband_root)
    if ib:
        ib_lines = [f"{dev}: ports {', '.join(ports) or 'none'}" for dev, ports in ib.items()]
    else:
        ib_lines = ["none (NCCL will use TCP sockets between nodes)"]
        if topology.nnodes > 1 and gpus.count:
            report.warnings.append(
                "multi-node GPU run without InfiniBand/RoCE devices: expect slow all-reduce"
            )
    report.sections.append(("InfiniBand", ib_lines))
    report.sections.append(("RDMA", rdma_lines(rdma)))
    report.warnings += rdma_warnings(rdma, env)

    shm = shm_bytes(shm_path)
    if shm is None:
        report.sections.append(("/dev/shm", [f"{shm_path} is missing"]))
        report.warnings.append(f"{shm_path} is missing; DataLoader workers need shared memory")
    else:
        report.sections.append(("/dev/shm", [f"size {_gib(shm)} ({shm} bytes)"]))
        warning = shm_warning(shm)
        if warning:
            report.warnings.append(warning)

    nccl = nccl_env(env)
    report.sections.append(
        ("NCCL env", [f"{k}={v}" for k, v in nccl.items()] or ["(none set; NCCL defaults)"])
    )

    launch = [
        f"nodes {topology.nnodes}, this node's rank {topology.node_rank}",
        f"processes per node {topology.nproc_per_node} ({topology.nproc_source})",
        f"world size {topology.world_size}",
        f"worker group restarts {topology.max_restarts} (MEGDET_MAX_RESTARTS)",
        "torchrun " + shlex.join(torchrun_arguments(topology)),
    ]
    if topology.shutdown_timeout is None:
        launch.append(f"shutdown timeout: torchrun's default {TORCHRUN_DEFAULT_SHUTDOWN_TIMEOUT} s")
        report.warnings.append(
            "MEGDET_GRACE_PERIOD_SECONDS is unset: torchrun kills the trainers "
            f"{TORCHRUN_DEFAULT_SHUTDOWN_TIMEOUT} s after SIGTERM, whatever the pod's grace "
            "period; a slower checkpoint is lost (the run chart sets it)"
        )
    else:
        launch.append(
            f"shutdown timeout {topology.shutdown_timeout} s "
            "(MEGDET_GRACE_PERIOD_SECONDS minus the launcher's margin)"
        )
    report.sections.append(("launch", launch))

    try:
        plan, source = plan_function(topology, megdet_args)
    except (SpecError, ValueError) as err:
        report.sections.append(("plan", [f"cannot plan: {err}"]))
        report.warnings.append(f"the run cannot be planned: {err}")
    else:
        s = plan.summary()
        report.sections.append(
            (
                "plan",
                [
                    f"from {source}",
                    f"world size {s['world_size']}, global batch {s['global_batch']}, "
                    f"lr {s['lr']:.6g}, max_iter {s['max_iter']}, steps {s['steps']}, "
                    f"warmup {s['warmup_iters']}",
                ],
            )
        )
    return report


def format_report(report: Report) -> str:
    """The report as text, one section per block."""
    lines = ["megdet doctor"]
    for title, body in report.sections:
        lines.append(f"  {title}:")
        lines += [f"    {line}" for line in body]
    for warning in report.warnings:
        lines.append(f"  WARNING: {warning}")
    return "\n".join(lines)
