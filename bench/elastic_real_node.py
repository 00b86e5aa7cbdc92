"""What a resize costs on the real node, against a plain suspend and resume of the same run.

One MegDetRun (the tiny detector on the shapes data, the ``train-ci`` image, 2 pods x 1 process
on the CPU over gloo, ``elastic`` 1..2, keep-batch) trains on the real node of a local control
plane, set up with the e2e tests' own helpers (tests/e2e: the operator chart, the controller on
the host under the chart's ServiceAccount, the policy that lets runs tolerate the node's taint,
the image imported into the node's containerd, the hostPath volumes). After each of its first
three checkpoints it is, in turn:

1. suspended (``spec.runPolicy.suspend: true``) and, once its pods are gone, resumed;
2. resized 2 -> 1 GPUs (``spec.gpus``);
3. resized 1 -> 2 GPUs;

and then trains to Succeeded. Each change is split into parts, every bound a recorded signal:

- ``react``: the bench's patch to the controller's write of the job (the API server's audit
  log: its delete for a resize, its suspend patch), both on this host's clock;
- ``checkpoint``: that write to the trainer's "Saved a checkpoint ... after SIGTERM" line in
  the old Master's log (containerd's timestamp of the line): the operator or the garbage
  collector deletes the pods, the kubelet's SIGTERM, the step in flight, the save;
- ``job down``: that line to the DELETED event of the last old pod (a watch of the pods);
- ``away`` (suspend only, not a cost): the last pod's DELETED event to the bench's resume patch;
- ``pods up``: the last old pod's DELETED event (a resize: the controller creates the next job
  on it; its create is in the audit log) or the resume patch, to the watch event in which the
  last new pod's container is running;
- ``rendezvous``: that to the trainer's first line in the new Master's log (the launcher,
  torchrun's rendezvous, the trainer's imports and its process group);
- ``data``: that to "Starting training from iteration" (the re-plan, the model, the checkpoint
  read, the data loader: the first iteration at the new size starts);
- ``lost``: images the old segment trained that the next one trains again (plan.json).

Needs the cluster built (``make cluster`` once) and the real node (docs/cluster.md); run it under
the cluster lock, as the e2e tests:

    flock /tmp/megdet-cluster.lock .venv/bin/python -m bench.elastic_real_node [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The e2e tests' modules, and the tests' own (test_e2e_real_training imports try_locally).
sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "tests")]

from e2e_helpers import (  # noqa: E402  (tests/e2e is not a package)
    CONTROLLER_USER,
    E2E_ROOT,
    OPERATOR_NAMESPACE,
    OPERATOR_RELEASE,
    ControllerProcess,
    apply_objects,
    eventually,
    get_json,
    helm,
    mdr,
)

from bench.elastic_resize import print_segments  # noqa: E402
from bench.harness import machine_load  # noqa: E402

NS = "bench-elastic"
RUN = "timed"
#: 50 iterations at the global batch of 4, a checkpoint every 10: the three changes come after
#: checkpoints 9, 19 and 29 (in the running segment's count) and leave the rest to finish.
MAX_ITER = 50
MASTER = "master"


def _stamp(text: str) -> float:
    """Epoch seconds of an RFC 3339 timestamp (containerd's nanoseconds, the audit log's
    microseconds, the API's seconds)."""
    text = text.rstrip("Z")
    if "." in text:
        head, frac = text.split(".", 1)
        return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + frac[:9])
    return datetime.fromisoformat(text + "+00:00").timestamp()


class PodWatch:
    """A watch of the run's pods: when each was created (ADDED), ran (its container running)
    and was deleted (DELETED), by uid; and a ``kubectl logs -f --timestamps`` of each Master,
    kept in a file."""

    def __init__(self, kube, folder: Path, namespace: str = NS) -> None:
        from kubernetes import client, config, watch

        self.kube = kube
        self.folder = folder
        self.namespace = namespace
        self.pods: dict[str, dict[str, Any]] = {}
        self.streams: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._watch = watch.Watch()
        self._stopped = False
        api = client.CoreV1Api(config.new_client_from_config(str(kube.kubeconfig)))
        self._thread = threading.Thread(target=self._run, args=(api,), daemon=True)
        self._thread.start()

    def _run(self, api) -> None:
        while not self._stopped:
            try:
                for event in self._watch.stream(api.list_namespaced_pod, self.namespace):
                    self._record(event)
            except Exception as err:  # a dropped connection: watch again (the list re-adds)
                print(f"elastic_real_node: pod watch: {err}; watching again", file=sys.stderr)
                time.sleep(0.5)

    def _record(self, event: dict[str, Any]) -> None:
        now = time.time()
        pod = event["object"]
        uid = pod.metadata.uid
        with self._lock:
            seen = self.pods.setdefault(
                uid,
                {
                    "name": pod.metadata.name,
                    "role": (pod.metadata.labels or {}).get("training.kubeflow.org/replica-type"),
                    "added": now,
                },
            )
            if event["type"] == "DELETED":
                seen["deleted"] = now
            conditions = pod.status.conditions or []
            if any(c.type == "PodScheduled" and c.status == "True" for c in conditions):
                seen.setdefault("scheduled", now)
            statuses = pod.status.container_statuses or []
            if statuses and all(s.state.terminated for s in statuses):
                seen.setdefault("terminated", now)
            if "running" not in seen and statuses and all(s.state.running for s in statuses):
                seen["running"] = now
                if seen["role"] == MASTER:
                    seen["log"] = str(self.folder / f"{pod.metadata.name}-{uid}.log")
                    self.streams.append(self._stream(pod.metadata.name, seen["log"]))

    def _stream(self, name: str, path: str) -> subprocess.Popen:
        kubectl = str(self.kube.binary("kubectl"))
        with open(path, "wb") as out:
            return subprocess.Popen(
                [kubectl, "logs", "-f", "--timestamps", "-n", self.namespace, name],
                env={"KUBECONFIG": str(self.kube.kubeconfig), "PATH": "/usr/bin:/bin"},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {uid: dict(p) for uid, p in self.pods.items()}

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()
        for proc in self.streams:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)


def log_lines(path: str) -> list[tuple[float, str]]:
    """(containerd's time, text) of each line a Master's log stream holds."""
    lines = []
    for line in Path(path).read_text(errors="replace").splitlines():
        stamp, _, text = line.partition(" ")
        with contextlib.suppress(ValueError):
            lines.append((_stamp(stamp), text))
    return lines


def first_line(path: str, words: str, after: float = 0.0) -> float | None:
    return next((t for t, text in log_lines(path) if words in text and t >= after), None)


#: The trainer's own lines on stdout: detectron2's ``[mm/dd hh:mm:ss logger]: ...``, with the
#: level first from WARNING up.
_TRAINER_LINE = re.compile(r"^(?:[A-Z]+ )?\[\d\d/\d\d \d\d:\d\d:\d\d ")


def trainer_lines(path: str) -> list[tuple[float, str]]:
    """(containerd's time, text) of the trainer's lines in a Master's log."""
    return [(t, text) for t, text in log_lines(path) if _TRAINER_LINE.match(text)]


def controller_writes(kube, verb: str, after: float) -> list[float]:
    """Times of the controller's ``verb`` requests on PyTorchJobs after ``after`` (audit log)."""
    times = []
    for event in kube.audit_events(user=CONTROLLER_USER):
        ref = event.get("objectRef") or {}
        if event.get("verb") == verb and ref.get("resource") == "pytorchjobs":
            if ref.get("subresource") or event.get("stage") != "ResponseComplete":
                continue
            stamp = _stamp(event["requestReceivedTimestamp"])
            if stamp >= after:
                times.append(stamp)
    return sorted(times)


def patch(kube, spec: dict[str, Any]) -> float:
    now = time.time()
    kube.kubectl("patch", "mdr", RUN, "-n", NS, "--type=merge", "-p", json.dumps({"spec": spec}))
    return now


def checkpoints(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("model_*.pth")}


def change(kube, pods: PodWatch, folder: Path, kind: str, gpus: int | None) -> dict[str, Any]:
    """One change (``suspend`` or ``resize`` to ``gpus``) of the running run, timed."""
    before = pods.snapshot()
    old = {uid for uid, p in before.items() if "deleted" not in p}
    (old_master,) = [before[uid] for uid in old if before[uid]["role"] == MASTER]
    patched = patch(kube, {"runPolicy": {"suspend": True}} if kind == "suspend" else {"gpus": gpus})

    def gone() -> float | None:
        now = pods.snapshot()
        return (
            max(now[u]["deleted"] for u in old) if all("deleted" in now[u] for u in old) else None
        )

    down = eventually(gone, timeout=600, interval=0.2, message="the old pods gone")
    resumed = patch(kube, {"runPolicy": {"suspend": False}}) if kind == "suspend" else None

    def new_master() -> dict[str, Any] | None:
        for uid, p in pods.snapshot().items():
            new = uid not in before and p["role"] == MASTER and "log" in p
            if new and first_line(p["log"], "Starting training from iteration"):
                return p
        return None

    master = eventually(new_master, timeout=900, interval=1, message="the first new iteration")
    new = {uid: p for uid, p in pods.snapshot().items() if uid not in before}
    running = max(p["running"] for p in new.values() if "running" in p)
    saved = first_line(old_master["log"], "after SIGTERM", after=patched)
    if saved is None:
        raise SystemExit(f"elastic_real_node: no SIGTERM checkpoint in {old_master['log']}")
    write = controller_writes(kube, "delete" if kind == "resize" else "patch", patched)
    started = trainer_lines(master["log"])[0][0]
    launched = first_line(master["log"], "megdet launch: world size")
    first_iter = first_line(master["log"], "Starting training from iteration")
    parts = {
        "react": write[0] - patched,
        "checkpoint": saved - write[0],
        "job down": down - saved,
        "pods up": running - (resumed or down),
        "rendezvous": started - running,
        "data": first_iter - started,
    }
    result = {
        "kind": kind,
        "gpus": gpus,
        "parts": parts,
        "total": sum(parts.values()),
        "patch_to_first_iteration": first_iter - patched,
        "pods_created_after_s": min(p["added"] for p in new.values()) - (resumed or down),
        # Of the rendezvous: the launcher's torchrun line to the trainer's first line.
        "torchrun_to_trainer_s": started - launched if launched else None,
    }
    if resumed is not None:
        result["away"] = resumed - down
    else:
        created = controller_writes(kube, "create", patched)
        result["job_created_after_s"] = created[0] - down if created else None
    return result


@contextlib.contextmanager
def real_node_session(
    workdir: Path,
    archive: Path | None = None,
    namespace: str = NS,
    timings: dict[str, Any] | None = None,
    also_import: tuple[Path, ...] = (),
) -> Iterator[tuple[Any, ControllerProcess, str, Path]]:
    """The e2e tests' session on a cluster of its own: the control plane, the real node, the
    operator chart, the controller, the policy for the node's taint, the image and volumes
    (in ``namespace``). Yields (cluster, controller, image, output folder); everything is ended
    afterwards. ``archive``: a train-ci image archive built before (default: built from this
    tree). ``timings`` gets ``imports``: (archive, bytes, seconds into the node's containerd) of
    each of ``also_import`` (imported first) and of the train-ci archive."""
    import yaml
    from test_e2e_real_training import shapes_volumes

    from cluster.control_plane import Cluster
    from cluster.node import TAINT_KEY, RealNode, import_image
    from imagebuild.build import build

    kube = Cluster(root=E2E_ROOT.parent / namespace / "cluster", ports_mode="auto", nodes=4)
    kube.down()
    ends = [lambda: kube.down(keep_logs=workdir / "logs")]
    try:
        kube.up(timeout=300)
        kube.start_real_node(timeout=600)
        node = RealNode(kube, echo=kube.echo)
        ends.append(node.teardown)
        values = workdir / "policy.yaml"
        values.write_text(
            yaml.safe_dump({"policy": {"tolerationKeys": ["nvidia.com/gpu", TAINT_KEY]}})
        )
        helm(
            kube, "install", OPERATOR_RELEASE, "charts/megdet-operator", "-n", OPERATOR_NAMESPACE,
            "--create-namespace", "-f", str(values), "--wait", "--timeout=300s", timeout=360,
        )  # fmt: skip
        controller = ControllerProcess(kube, workdir)
        controller.start()
        ends.append(controller.stop)
        archive = archive or build("train-ci")
        imports = (timings if timings is not None else {}).setdefault("imports", [])
        for path in (*also_import, archive):
            started = time.monotonic()
            names = import_image(node.socket, path, timeout=1800)
            imports.append((str(path), path.stat().st_size, time.monotonic() - started))
        image = names[0]
        volumes = shapes_volumes(kube, namespace)
        folders = next(volumes)
        ends.append(lambda: next(volumes, None))
        yield kube, controller, image, folders["output"]
    finally:
        for end in reversed(ends):
            with contextlib.suppress(Exception):
                end()


def run(workdir: Path, archive: Path | None = None) -> dict[str, Any]:
    from test_e2e_real_training import run_values

    with real_node_session(workdir, archive) as (kube, _controller, image, output):
        folder = output / RUN
        spec = {k: v for k, v in run_values(image).items() if k != "runName"}
        spec.update(
            maxIter=MAX_ITER,
            steps=[40],
            elastic={"minGpus": 1, "maxGpus": 2, "resize": "keep-batch"},
        )
        pods = PodWatch(kube, workdir)
        try:
            apply_objects(kube, mdr(RUN, NS, spec))
            changes = []
            for kind, gpus in (("suspend", None), ("resize", 1), ("resize", 2)):
                seen = checkpoints(folder) if folder.is_dir() else set()
                eventually(
                    lambda seen=seen: folder.is_dir() and checkpoints(folder) - seen,
                    timeout=1200, interval=0.5, message="the next checkpoint",
                )  # fmt: skip
                changes.append(change(kube, pods, folder, kind, gpus))
            status = eventually(
                lambda: (s := get_json(kube, "mdr", RUN, "-n", NS).get("status") or {}).get(
                    "phase"
                )
                in ("Succeeded", "Failed")
                and s,
                timeout=1200, interval=2, message="the run to finish",
            )  # fmt: skip
        finally:
            pods.stop()
            # The watch's record stays beside the log streams, a failed run's too.
            (workdir / "pods.json").write_text(json.dumps(pods.snapshot(), indent=1))
        plan = json.loads((folder / "plan.json").read_text())
        segments = plan["segments"]
        for n, item in enumerate(changes):
            item["lost_images"] = segments[n]["images_end"] - segments[n + 1]["images_start"]
            item["from_iteration"] = segments[n]["last_iter"]
        return {
            "phase": status["phase"],
            "attempt": status.get("attempt"),
            "max_iter": MAX_ITER,
            "changes": changes,
            "segments": segments,
            "images_seen": plan["images_seen"],
            "load": machine_load(),
        }


def print_report(result: dict[str, Any]) -> None:
    print(
        f"elastic_real_node: {result['max_iter']} iterations of batch 4 on the real node, "
        f"{result['phase']} (attempt {result['attempt']}), {result['images_seen']} images; "
        f"load {result['load']}"
    )
    names = list(result["changes"][0]["parts"])
    header = ["change", *names, "total", "lost images"]
    print("  " + " | ".join(header))
    for c in result["changes"]:
        label = "suspend+resume" if c["kind"] == "suspend" else f"resize to {c['gpus']}"
        cells = [f"{c['parts'][n]:.1f}" for n in names]
        print(f"  {label} | " + " | ".join(cells) + f" | {c['total']:.1f} | {c['lost_images']}")
        keys = ("away", "job_created_after_s", "pods_created_after_s", "torchrun_to_trainer_s")
        extra = {k: c[k] for k in keys if k in c}
        print(f"    {json.dumps({k: round(v, 2) if v else v for k, v in extra.items()})}")
    print_segments(result["segments"])


def real_node_parser(
    doc: str, workdir: str, workdir_help: str, image_help: str
) -> argparse.ArgumentParser:
    """The CLI shared by the benchmarks on a real node (:func:`real_node_session`): --image
    (its ``archive``), --workdir (default output/``workdir``), --json. A benchmark adds its own
    flags to the returned parser."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--image", type=Path, metavar="ARCHIVE", help=image_help)
    parser.add_argument(
        "--workdir", type=Path, default=ROOT / "output" / workdir, help=workdir_help
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = real_node_parser(
        __doc__,
        "bench-elastic",
        "where the log streams and the cluster's logs stay",
        "a train-ci image archive built before (default: build it from this tree)",
    )
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    result = run(args.workdir.resolve(), args.image)
    text = json.dumps(result, indent=2)
    (args.workdir / "result.json").write_text(text)
    print(text) if args.json else print_report(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
