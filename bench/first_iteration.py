"""A 2-pod run's time to its first iteration on the real node, part by part, against a floor.

The floor is what no run can beat on the same node: a bare pod of the same image (``train-ci``)
whose only work is ``python -c "import torch, detectron2"``, timed from its create to the
imports done. The run is a MegDetRun of the e2e tests' tiny run (examples/local: the tiny
detector on the shapes data, 2 pods x 1 process on the CPU over gloo, 30 iterations, the
evaluation at the end), timed from its create to its first iteration, then to its end. The two
take turns in one session (floor, run, floor, run, ...: the same minutes, the same machine
state), each deleted before the next starts; the report gives each part's median and the ratio
of the medians of the totals (goal: under 1.5).

Every bound is a recorded signal on this host's clock (the node is this machine):

- the bench's own create (before ``kubectl apply``);
- a watch of the namespace's pods: the event in which a pod is first seen (ADDED), scheduled
  (``PodScheduled`` True), its containers running, all terminated;
- containerd's timestamps of the lines in the pods' logs (``kubectl logs --timestamps``): the
  floor's own line after its imports, the launcher's and the trainer's lines in the Master's;
- the first iteration's end: the run checkpoints every iteration, and the first "Saving
  checkpoint to" line follows the first step at once (the trainer's own report,
  ``status.progress.firstIterationTime``, reaches only a controller running as a pod, not the
  host's of this session); the run's ``status.startup`` (whole seconds) is kept beside.

Floor parts: ``scheduling`` (create to scheduled), ``container start`` (to running: sandbox,
the image's snapshot mounted; nothing is pulled, the image is in the node's containerd),
``imports`` (to the imports done: the interpreter, ``import torch, detectron2``).

Run parts: ``controller`` (create to the first pod seen: the controller renders and creates
the PyTorchJob, the training operator its pods), ``scheduling`` (to the last pod scheduled),
``container start`` (to the last pod's containers running), ``launch + rendezvous`` (to the
trainer's first line: ``megdet launch``, torchrun's rendezvous of both pods, the trainer's
imports and process group), ``data + model`` (to "Starting training from iteration": the plan,
the model, the data loader), ``first iteration``; after it, not start-up: ``training`` (to
detectron2's "Total training time" line), ``evaluation`` (to the last line of the COCO
evaluation's results), ``finish`` (to the last container terminated: the report, the
launcher's exit).

The image's import into the node's containerd (what a pull and unpack would cost; pods use
``imagePullPolicy: Never``) is timed once per session, with the controller image's archive
beside it for a second size.

Needs the cluster built (``make cluster`` once) and the real node (docs/cluster.md); under the
cluster lock, as the e2e tests:

    flock /tmp/megdet-cluster.lock .venv/bin/python -m bench.first_iteration \\
        --image output/images/megdet-train-ci-<hash>.oci.tar --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "tests")]

from bench.elastic_real_node import _TRAINER_LINE, log_lines, real_node_parser  # noqa: E402
from bench.harness import machine_load  # noqa: E402

NS = "bench-first"
FLOOR_LABEL = "megdet-floor"
#: The floor's program: the imports, then one line with what they mapped (the image's files a
#: process holds open or mapped: shared libraries and extension modules).
FLOOR_CODE = """\
import json, os, time
t0 = time.time()
import torch, detectron2
t1 = time.time()
files = {}
for line in open('/proc/self/maps'):
    part = line.split(None, 5)
    if len(part) == 6 and part[5].startswith('/') and part[5].strip() not in files:
        path = part[5].strip()
        files[path] = os.path.getsize(path) if os.path.exists(path) else 0
nv = sorted({p.split('/site-packages/')[1].split('/')[1] for p in files if '/nvidia/' in p})
io = dict(l.split(': ') for l in open('/proc/self/io').read().splitlines())
print('megdet-floor ' + json.dumps({'start': t0, 'imported': t1, 'mapped_files': len(files),
      'mapped_mb': sum(files.values()) / 1e6, 'nvidia': nv,
      'read_mb': int(io['rchar']) / 1e6}), flush=True)
"""

#: The pod a process belongs to, from its cgroup path (cgroupfs: ``pod<uid>``; systemd:
#: ``pod<uid with underscores>.slice``).
_POD_CGROUP = re.compile(r"pod([0-9a-f]{8}(?:[-_][0-9a-f]{4}){3}[-_][0-9a-f]{12})")
#: The processes of a training pod the bench times by their start: torchrun (after the
#: launcher's diagnostic) and the trainer (spawned by torchrun once the rendezvous is done).
PROCESS_KINDS = (("torchrun", "torch.distributed.run"), ("trainer", "megdet train"))

FLOOR_PARTS = ("scheduling", "container start", "imports")
RUN_PARTS = (
    "controller",
    "scheduling",
    "container start",
    "launch + rendezvous",
    "data + model",
    "first iteration",
)
END_PARTS = ("training", "evaluation", "finish")


def floor_pod(name: str, image: str, values: dict[str, Any]) -> dict[str, Any]:
    """The floor's bare pod: the run's image, placement, resources and security context (the
    namespace enforces the ``restricted`` Pod Security level), the imports as its only work."""
    resources = values["resources"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": FLOOR_LABEL}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "nodeSelector": values["nodeSelector"],
            "tolerations": values["tolerations"],
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "floor",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", FLOOR_CODE],
                    "resources": {
                        "requests": {"cpu": resources["cpu"], "memory": resources["memory"]},
                        "limits": {"memory": resources["memory"]},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def floor_sample(created: float, pod: dict[str, Any], lines: list[tuple[float, str]]) -> dict:
    """The floor's parts from its pod's record (the watch's times) and its log's lines."""
    stamp, report = next((t, x) for t, x in lines if x.startswith("megdet-floor "))
    info = json.loads(report.removeprefix("megdet-floor "))
    parts = {
        "scheduling": pod["scheduled"] - created,
        "container start": pod["running"] - pod["scheduled"],
        "imports": stamp - pod["running"],
    }
    return {
        "parts": parts,
        "total": stamp - created,
        "import_s": info["imported"] - info["start"],
        "mapped_files": info["mapped_files"],
        "mapped_mb": info["mapped_mb"],
        "read_mb": info["read_mb"],
        "nvidia": info["nvidia"],
    }


def _line(lines: list[tuple[float, str]], words: str, last: bool = False) -> float:
    found = [t for t, text in lines if words in text]
    if not found:
        raise ValueError(f"no line with {words!r} in the Master's log")
    return found[-1] if last else found[0]


def run_sample(
    created: float,
    pods: list[dict[str, Any]],
    lines: list[tuple[float, str]],
    status: dict[str, Any],
) -> dict[str, Any]:
    """The run's parts from its pods' records, its Master's log lines (containerd's stamps)
    and its status (``startup`` and ``progress.firstIterationTime`` kept beside)."""
    from megdet.progress import parse_time

    trainer = trainer_lines_of(lines)
    loaded = _line(lines, "Starting training from iteration")
    # The first iteration's checkpoint (the run's checkpoint period is 1): its save follows the
    # step at once (under 0.5 s for the tiny detector).
    first = next((t for t, x in lines if "Saving checkpoint to" in x and t >= loaded), None)
    if first is None:
        raise ValueError("no 'Saving checkpoint to' line after the first iteration")
    reported = parse_time((status.get("progress") or {}).get("firstIterationTime"))
    parts = {
        "controller": min(p["added"] for p in pods) - created,
        "scheduling": max(p["scheduled"] for p in pods) - min(p["added"] for p in pods),
        "container start": max(p["running"] for p in pods) - max(p["scheduled"] for p in pods),
        "launch + rendezvous": trainer[0][0] - max(p["running"] for p in pods),
        "data + model": loaded - trainer[0][0],
        "first iteration": max(first - loaded, 0.0),
    }
    trained = _line(lines, "Total training time")
    evaluated = _line(lines, "copypaste:", last=True)
    end = {
        "training": trained - first,
        "evaluation": evaluated - trained,
        "finish": max(p["terminated"] for p in pods) - evaluated,
    }
    launched = _line(lines, "megdet launch: world size")
    return {
        "parts": parts,
        "total": first - created,
        "end": end,
        "to_end": max(p["terminated"] for p in pods) - created,
        "torchrun_to_trainer_s": trainer[0][0] - launched,
        "startup": status.get("startup") or {},
        # The trainer's own report (whole seconds), where it reached the controller.
        "reported_first_iteration": reported.timestamp() if reported else None,
        "phase": status.get("phase"),
    }


def process_start(stat: str, boot_time: float, ticks: int) -> float:
    """Epoch seconds a process started, from its ``/proc/<pid>/stat`` line (field 22, in clock
    ticks since boot; the command in field 2 may hold spaces and parentheses)."""
    fields = stat.rsplit(")", 1)[1].split()
    return boot_time + int(fields[19]) / ticks


def process_kind(cmdline: str) -> str | None:
    """``torchrun`` or ``trainer`` for a training pod's process, from its command line."""
    return next((kind for kind, words in PROCESS_KINDS if words in cmdline), None)


def pod_of_cgroup(text: str) -> str | None:
    """The pod uid a ``/proc/<pid>/cgroup`` names, or None (not a pod's process)."""
    found = _POD_CGROUP.search(text)
    return found.group(1).replace("_", "-") if found else None


class ProcessStarts:
    """When each training pod's torchrun and trainer processes started, by pod uid: a scan of
    ``/proc`` every 0.2 s (the node's pods are this machine's processes)."""

    def __init__(self) -> None:
        self.starts: dict[str, dict[str, float]] = {}
        self._seen: set[int] = set()
        self._stopped = threading.Event()
        stat = Path("/proc/stat").read_text().splitlines()
        self._boot = next(float(line.split()[1]) for line in stat if line.startswith("btime"))
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(0.2):
            for name in os.listdir("/proc"):
                if name.isdigit() and int(name) not in self._seen:
                    self._look(int(name))

    def _look(self, pid: int) -> None:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            kind = process_kind(cmdline)
            pod = pod_of_cgroup(Path(f"/proc/{pid}/cgroup").read_text()) if kind else None
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (OSError, UnicodeDecodeError):
            return
        self._seen.add(pid)
        if kind and pod:
            start = process_start(stat, self._boot, self._ticks)
            mine = self.starts.setdefault(pod, {})
            mine[kind] = min(mine.get(kind, start), start)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(5)


def launch_split(master: dict[str, Any], starts: dict[str, float], first_line: float) -> dict:
    """``launch + rendezvous`` of the Master, split by its processes' starts: ``launcher``
    (its containers running to torchrun's start: ``megdet launch`` and its diagnostic, which
    imports torch), ``torchrun + rendezvous`` (to the trainer's start: torchrun's imports and the
    c10d rendezvous of both pods), ``trainer start`` (to its first line: the trainer's imports,
    the process group, the output's stamp)."""
    if "torchrun" not in starts or "trainer" not in starts:
        return {}
    return {
        "launcher": starts["torchrun"] - master["running"],
        "torchrun + rendezvous": starts["trainer"] - starts["torchrun"],
        "trainer start": first_line - starts["trainer"],
    }


def trainer_lines_of(lines: list[tuple[float, str]]) -> list[tuple[float, str]]:
    found = [(t, x) for t, x in lines if _TRAINER_LINE.match(x)]
    if not found:
        raise ValueError("no trainer line in the Master's log")
    return found


def summarize(floors: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of each part and total, and the ratio of the run's median total to the
    floor's; the largest part of the run named."""
    if not floors or not runs:
        raise ValueError("need at least one floor and one run sample")

    def med(samples: list[dict[str, Any]], names: tuple[str, ...], key: str) -> dict[str, float]:
        return {n: statistics.median(s[key][n] for s in samples) for n in names}

    floor = {"parts": med(floors, FLOOR_PARTS, "parts")}
    floor["total"] = statistics.median(s["total"] for s in floors)
    run = {"parts": med(runs, RUN_PARTS, "parts"), "end": med(runs, END_PARTS, "end")}
    run["total"] = statistics.median(s["total"] for s in runs)
    splits = [s["launch_split"] for s in runs if s.get("launch_split")]
    if splits:
        run["launch_split"] = {n: statistics.median(x[n] for x in splits) for n in splits[0]}
    run["to_end"] = statistics.median(s["to_end"] for s in runs)
    largest = max(run["parts"], key=run["parts"].get)
    return {
        "floor": floor,
        "run": run,
        "ratio": run["total"] / floor["total"],
        "largest": largest,
        "repeats": min(len(floors), len(runs)),
    }


def _row(values: dict[str, float], names: tuple[str, ...]) -> str:
    return " | ".join(f"{values[name]:.2f}" for name in names)


def _cells(parts: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in parts.items())


def _samples(
    title: str,
    names: tuple[str, ...],
    samples: list[dict[str, Any]],
    more: Callable[[dict[str, Any]], str],
) -> list[str]:
    """One kind of sample: ``title`` and its parts' ``names``, then a line per sample: its
    parts, its total and ``more(sample)``."""
    lines = [f"  {title}: " + " | ".join(names)]
    for n, s in enumerate(samples, 1):
        lines.append(f"    #{n}: {_row(s['parts'], names)} | total {s['total']:.2f} s{more(s)}")
    return lines


def _floor_more(s: dict[str, Any]) -> str:
    """A floor sample's in-process import and what it mapped."""
    return (
        f" (in-process import {s['import_s']:.2f} s; {s['mapped_files']} files mapped, "
        f"{s['mapped_mb']:.0f} MB)"
    )


def _run_more(s: dict[str, Any]) -> str:
    """A run sample's parts to its end, its status.startup, and its launch split if any."""
    text = (
        f"; then {_row(s['end'], END_PARTS)} ({' | '.join(END_PARTS)}); "
        f"status.startup {json.dumps(s['startup'])}"
    )
    if s.get("launch_split"):
        text += "\n        launch + rendezvous: " + _cells(s["launch_split"])
    return text


def format_report(result: dict[str, Any]) -> str:
    """The report: each sample's parts and total, then the medians and the ratio."""
    out = [
        f"first_iteration: {len(result['floors'])} floor + {len(result['runs'])} run samples, "
        f"interleaved; load {result.get('load', '?')}"
    ]
    for path, size, seconds in result.get("imports", []):
        out.append(
            f"  image import into the node's containerd: {Path(path).name} "
            f"{size / 1e6:,.0f} MB in {seconds:.1f} s ({size / 1e6 / seconds:.0f} MB/s)"
        )
    floors, runs = result["floors"], result["runs"]
    out += _samples("floor (bare pod, import torch, detectron2)", FLOOR_PARTS, floors, _floor_more)
    out += _samples("run (2 pods) to its first iteration", RUN_PARTS, runs, _run_more)
    summary = result["summary"]
    floor, run = summary["floor"], summary["run"]
    out.append(f"  medians: floor {_cells(floor['parts'])}, total {floor['total']:.2f} s")
    out.append(
        f"           run {_cells(run['parts'])}, total {run['total']:.2f} s; "
        f"{_cells(run['end'])}, to the end {run['to_end']:.2f} s"
    )
    if run.get("launch_split"):
        out.append("           launch + rendezvous: " + _cells(run["launch_split"]))
    verdict = "within" if summary["ratio"] < 1.5 else "above"
    out.append(
        f"  run / floor (medians of the totals): {summary['ratio']:.2f} ({verdict} the 1.5 goal);"
        f" the run's largest part: {summary['largest']}"
    )
    return "\n".join(out)


def _wait(check: Any, timeout: float, message: str, interval: float = 0.2) -> Any:
    from e2e_helpers import eventually

    return eventually(check, timeout=timeout, interval=interval, message=message)


def measure_floor(kube: Any, watch: Any, image: str, values: dict, name: str) -> dict:
    from e2e_helpers import apply_objects

    created = time.time()
    apply_objects(kube, {**floor_pod(name, image, values)}, extra=("-n", NS))
    pod = _wait(
        lambda: next(
            (p for p in watch.snapshot().values() if p["name"] == name and "terminated" in p),
            None,
        ),
        timeout=600,
        message=f"floor pod {name} done",
    )
    logs = kube.kubectl("logs", "--timestamps", "-n", NS, name).stdout
    path = watch.folder / f"{name}.log"
    path.write_text(logs)
    sample = floor_sample(created, pod, log_lines(str(path)))
    kube.kubectl("delete", "pod", name, "-n", NS, "--wait=true")
    return sample


def run_spec(image: str, max_iter: int) -> dict[str, Any]:
    """The MegDetRun's spec: the e2e tests' tiny run (examples/local), ``max_iter`` iterations
    (its LR step and warm-up within them), the evaluation at the end."""
    from test_e2e_real_training import run_values

    spec = {k: v for k, v in run_values(image).items() if k != "runName"}
    spec.update(maxIter=max_iter, steps=[max(1, max_iter - 1)], warmupIters=min(5, max_iter // 2))
    # A checkpoint after every iteration: the first one's log line ends the first iteration.
    spec["extraOverrides"] = {**spec.get("extraOverrides", {}), "SOLVER.CHECKPOINT_PERIOD": 1}
    return spec


def measure_run(
    kube: Any, watch: Any, procs: ProcessStarts, image: str, name: str, max_iter: int
) -> dict:
    from e2e_helpers import apply_objects, get_json, mdr

    spec = run_spec(image, max_iter)
    created = time.time()
    apply_objects(kube, mdr(name, NS, spec))

    def finished() -> dict[str, Any] | None:
        status = get_json(kube, "mdr", name, "-n", NS).get("status") or {}
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    status = _wait(finished, timeout=1200, interval=1, message=f"run {name} finished")
    if status["phase"] != "Succeeded":
        raise SystemExit(f"first_iteration: run {name} {status['phase']}: {status}")

    def ended() -> dict[str, dict[str, Any]] | None:
        now = watch.snapshot().items()
        mine = {uid: p for uid, p in now if p["name"].startswith(f"{name}-")}
        return mine if len(mine) == 2 and all("terminated" in p for p in mine.values()) else None

    pods = _wait(ended, timeout=300, message=f"run {name}'s containers ended")
    (uid,) = [uid for uid, p in pods.items() if p["role"] == "master"]
    master = pods[uid]
    # The stream ends with the container; read the log once more, complete.
    logs = kube.kubectl("logs", "--timestamps", "-n", NS, master["name"]).stdout
    path = watch.folder / f"{name}-master.log"
    path.write_text(logs)
    lines = log_lines(str(path))
    sample = run_sample(created, list(pods.values()), lines, status)
    sample["launch_split"] = launch_split(
        master, procs.starts.get(uid, {}), trainer_lines_of(lines)[0][0]
    )
    kube.kubectl("delete", "mdr", name, "-n", NS, "--wait=true")
    _wait(
        lambda: not any(
            p["name"].startswith(f"{name}-") and "deleted" not in p
            for p in watch.snapshot().values()
        ),
        timeout=300,
        message=f"run {name}'s pods gone",
    )
    return sample


def run(
    workdir: Path, archive: Path, repeats: int, also_import: tuple[Path, ...], max_iter: int
) -> dict:
    from test_e2e_real_training import run_values

    from bench.elastic_real_node import PodWatch, real_node_session

    timings: dict[str, Any] = {}
    floors, runs = [], []
    with real_node_session(workdir, archive, NS, timings, also_import) as (kube, _c, image, _o):
        values = run_values(image)
        watch = PodWatch(kube, workdir, namespace=NS)
        procs = ProcessStarts()
        try:
            for n in range(1, repeats + 1):
                floors.append(measure_floor(kube, watch, image, values, f"floor-{n}"))
                print(f"first_iteration: floor {n}: {floors[-1]['total']:.2f} s", file=sys.stderr)
                runs.append(measure_run(kube, watch, procs, image, f"first-{n}", max_iter))
                print(f"first_iteration: run {n}: {runs[-1]['total']:.2f} s", file=sys.stderr)
        finally:
            procs.stop()
            watch.stop()
            (workdir / "pods.json").write_text(json.dumps(watch.snapshot(), indent=1))
    return {
        "image": image,
        "imports": timings.get("imports", []),
        "max_iter": max_iter,
        "floors": floors,
        "runs": runs,
        "summary": summarize(floors, runs),
        "load": machine_load(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = real_node_parser(
        __doc__,
        "bench-first",
        "where the logs, pods.json and result.json stay",
        "the train-ci image archive (output/images/megdet-train-ci-*.oci.tar)",
    )
    parser.add_argument(
        "--report", type=Path, metavar="RESULT_JSON",
        help="print the report of a result.json written before (no cluster)",
    )  # fmt: skip
    parser.add_argument(
        "--repeats", type=int, default=3, help="floor and run samples each, interleaved (>= 1)"
    )
    parser.add_argument(
        "--max-iter", type=int, default=4,
        help="the run's iterations (>= 2; its start-up does not depend on them; few keep it short)",
    )  # fmt: skip
    parser.add_argument(
        "--also-import", type=Path, action="append", default=[], metavar="ARCHIVE",
        help="another archive to time into the node's containerd first (a second size)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.max_iter < 2:
        parser.error(f"--max-iter must be at least 2, got {args.max_iter}")
    if args.report is not None:
        if not args.report.is_file():
            parser.error(f"--report: no result file at {args.report}")
        return args
    if args.image is None:
        parser.error("--image is required (or --report RESULT_JSON)")
    for path in (args.image, *args.also_import):
        if not path.is_file():
            parser.error(f"no image archive at {path} (make suite-images builds output/images)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report is not None:
        print(format_report(json.loads(args.report.read_text())))
        return 0
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = run(
        args.workdir.resolve(), args.image, args.repeats, tuple(args.also_import), args.max_iter
    )
    (args.workdir / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
