"""One MegDetRun on the real node, watched from its creation through a resize 2 -> 1 -> 2 and a
Kueue preemption to Succeeded; each test asserts one thing on what the module recorded.

The run: 2 pods (gpus 2, gpusPerNode 1, ``elastic`` 1..2 keep-batch, ``kueue.queueName``)
train the tiny detector on the shapes dataset with the ``train-ci`` image, the operator chart's
controller running as a pod on the node (``controller_pod``, tests/e2e/conftest.py: one install
for the real-training module and this one; the pods report their progress to it), Kueue v0.19.0
started before it (so it watches the Workloads). A ``kubectl get --watch`` of the run, started
before the run exists, records every version the API server sends, with the time it arrived.
The story, one step after another:

1. Kueue admits the run (a ClusterQueue of 2 GPUs that preempts lower priorities within
   itself) and the job trains, its stage Training in the run's status, to a checkpoint.
2. ``spec.gpus`` is patched to 1: the controller records the resize, deletes the PyTorchJob in
   the foreground (the kubelet's SIGTERM: the trainer saves where it stops) and creates it
   with one pod; the trainer re-plans for 1 worker (keep-batch: the global batch 4 kept
   through 2 accumulation steps). After that job's next checkpoint ``gpus`` goes back to 2.
3. After the 2-pod job's next checkpoint, a Workload of priority 1000 asking for both GPUs is
   queued: Kueue evicts the run's Workload (``Evicted``, reason ``Preempted``) and sets the
   PyTorchJob's ``runPolicy.suspend`` (kueue pkg/controller/jobframework/reconciler.go,
   ``stopJob``); the training operator deletes the pods and the run shows ``Suspended``.
   While the other Workload holds the GPUs the job stays suspended: the controller does not
   undo Kueue's suspend. Once it is deleted, Kueue admits the run's Workload again and resumes
   the job; the trainer continues at equal images seen on the same 2 workers.
4. The run reaches Succeeded with the planned images.

The preemptor is a Workload of its own (no job behind it: Kueue admits it, nothing runs), so the
GPUs it takes are only Kueue's accounting and the module trains one run.

Measured and printed: the whole story's time, each resize from the patch to the re-plan line
of the new job's first pod (the last line the trainer logs before its first iteration at the
new size), and the preemption from the preemptor's creation to the resumed job's pods.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import (
    apply_objects,
    condition,
    eventually,
    get_json,
    get_or_none,
    mdr,
    pods_of,
    preemptor,
)
from test_e2e_real_training import run_values, shapes_volumes

from megdet.progress import parse_time

NS = "real-shared"
RUN = "story"
#: 120 iterations at the global batch of 4 (which keep-batch keeps), a checkpoint every 15:
#: one checkpoint before each of the three stops. An iteration takes about 0.5 s (the two
#: 1-thread pods on an idle machine), and a stretch trains until the controller writes its
#: stage Training, at most once per run every --progress-interval (10 s in README's operator
#: values, about 20 iterations), then to its next checkpoint (at most 15), then a few more
#: until the stop lands (3 at each stop): at most about 38 in a 2-GPU stretch and 28 in the
#: 1-GPU one (two micro-batches an iteration), about 104 before the preemption at worst, so the
#: run does not reach its end first (at 50 iterations and a checkpoint every 5 it did).
#: Measured (2026-12-07, the fixture prints them): 17, 15 and 15. At the chart's default
#: interval (30 s) they were about 20, 60 and 60, and the run trained 200.
MAX_ITER, PERIOD = 120, 15
FLAVOR, CLUSTER_QUEUE, LOCAL_QUEUE = "real-node", "real-node-gpus", "training"
PREEMPTOR = "urgent"
JOB_PODS = f"training.kubeflow.org/job-name={RUN}"
#: The conditions of a run's life (controller/lifecycle.py) and the job's phases.
TYPES = ("PodsScheduled", "Initialized", "Training", "Evaluating", "Running", "Succeeded")
#: The reasons of Initialized=False, in the order an attempt passes through them.
INITIALIZING = {"WaitingForKubelet": 0, "PodInitializing": 1, "ContainerCreating": 1,
                "Rendezvous": 2, "LoadingDataAndModel": 3}  # fmt: skip
#: The stages before an attempt trains.
BEFORE_TRAINING = {"Pending", "Queued", "Scheduling", "Initializing"}
pytestmark = [pytest.mark.timeout(2400), pytest.mark.real_pods]


@pytest.fixture(scope="module")
def volumes(kube, real_node) -> Iterator[dict[str, Path]]:
    """The shapes dataset and an empty output folder, each on a PersistentVolume."""
    yield from shapes_volumes(kube, NS)


@pytest.fixture(scope="module")
def queue(kube, volumes) -> Iterator[str]:
    """Kueue (started by ``controller_pod`` before the controller, or here), a ClusterQueue of
    2 GPUs (the run's) that preempts lower priorities within itself, and a LocalQueue in the
    run's namespace."""
    kube.start_kueue()
    quotas = {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}
    resources = [{"name": k, "nominalQuota": v} for k, v in quotas.items()]
    apply_objects(
        kube,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": list(quotas),
                        "flavors": [{"name": FLAVOR, "resources": resources}],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": NS},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    )
    yield LOCAL_QUEUE
    kube.kubectl("delete", "clusterqueue", CLUSTER_QUEUE, "--wait=false", check=False)


class RunWatch:
    """``kubectl get mdr --watch -o json`` of one run (by a field selector: a watch of a name
    that does not exist yet fails); every version it delivers, in order, with the monotonic
    time it arrived. :meth:`wait` wakes on each version, so nothing polls the run."""

    def __init__(self, kube, ns: str, name: str) -> None:
        self.versions: list[tuple[float, dict[str, Any]]] = []
        self.arrived = threading.Condition()
        command = [kube.binary("kubectl"), "get", "mdr", "-n", ns, "--field-selector",
                   f"metadata.name={name}", "--watch", "-o", "json"]  # fmt: skip
        self.proc = subprocess.Popen(
            command, env=kube.env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        decoder, buffer = json.JSONDecoder(), ""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            buffer += line
            try:
                obj, end = decoder.raw_decode(buffer.lstrip())
            except ValueError:
                continue
            buffer = buffer.lstrip()[end:]
            with self.arrived:
                for item in obj.get("items", []) if obj.get("kind", "").endswith("List") else [obj]:
                    self.versions.append((time.monotonic(), item))
                self.arrived.notify_all()
        with self.arrived:
            self.arrived.notify_all()

    def status(self) -> dict[str, Any]:
        """The newest version's status ({} before the first)."""
        with self.arrived:
            return (self.versions[-1][1].get("status") or {}) if self.versions else {}

    def wait(self, check: Callable[[dict[str, Any]], Any], timeout: float, message: str) -> Any:
        """``check`` of the newest status, each time a version arrives, until it is truthy."""
        deadline = time.monotonic() + timeout
        with self.arrived:
            while True:
                status = (self.versions[-1][1].get("status") or {}) if self.versions else {}
                if found := check(status):
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    ended = "" if self.proc.poll() is None else " (the watch ended)"
                    raise AssertionError(f"{message} not reached in {timeout:.0f} s{ended}")
                self.arrived.wait(min(left, 5))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@dataclass
class Story:
    """What the module recorded: the watch's versions, when each step began (monotonic), what
    it saw on the way, and the run, its job's log and its files at the end."""

    versions: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    #: Monotonic times: created, resized to 1, resized to 2, preempted, preemptor deleted, done.
    at: dict[str, float] = field(default_factory=dict)
    #: What the steps saw on the way (the checks below read them).
    seen: dict[str, Any] = field(default_factory=dict)
    final: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    table: list[str] = field(default_factory=list)
    master_log: str = ""
    log: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    model_final_bytes: int = 0

    def stretches(self) -> list[list[tuple[float, dict[str, Any]]]]:
        """The versions between one stop and the next (the resizes and the preemption)."""
        cuts = [self.at[k] for k in ("resized to 1", "resized to 2", "preempted")]
        parts: list[list[tuple[float, dict[str, Any]]]] = [[] for _ in range(len(cuts) + 1)]
        for arrived, obj in self.versions:
            parts[sum(arrived >= cut for cut in cuts)].append((arrived, obj))
        return parts


def checkpoints(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("model_*.pth")} if folder.is_dir() else set()


def new_checkpoint(folder: Path, seen: set[str], message: str) -> set[str]:
    return eventually(lambda: checkpoints(folder) - seen, timeout=900, interval=1, message=message)


def master_log(kube, job_uid: str) -> str:
    """The log of the Master pod of the job with ``job_uid`` ("" until it has one)."""
    for pod in pods_of(kube, NS, JOB_PODS):
        owners = {ref.get("uid") for ref in pod["metadata"].get("ownerReferences") or []}
        role = pod["metadata"]["labels"].get("training.kubeflow.org/replica-type")
        if job_uid in owners and role == "master":
            return kube.kubectl("logs", "-n", NS, pod["metadata"]["name"], check=False).stdout
    return ""


def resize(kube, watch: RunWatch, gpus: int, attempt: int, workers: int) -> float:
    """Patch ``spec.gpus`` and wait for the new job's Master to log its re-plan for
    ``workers``; returns the seconds from the patch to that line."""
    patched = time.monotonic()
    patch = json.dumps({"spec": {"gpus": gpus}})
    kube.kubectl("patch", "mdr", RUN, "-n", NS, "--type=merge", "-p", patch)
    status = watch.wait(
        lambda s: s.get("attempt") == attempt and s, timeout=600, message=f"attempt {attempt}"
    )
    eventually(
        lambda: f"images on {workers} workers (was" in master_log(kube, status["jobUID"]),
        timeout=900,
        interval=1,
        message=f"the re-plan for {workers} workers in the new Master's log",
    )
    return time.monotonic() - patched


def run_workload(kube) -> dict[str, Any] | None:
    """The Workload Kueue made for the run's current PyTorchJob (a deleted job's may linger
    until the garbage collector gets to it)."""
    job = get_or_none(kube, "pytorchjob", RUN, "-n", NS)
    uid = (job or {}).get("metadata", {}).get("uid")
    for item in get_json(kube, "workloads.kueue.x-k8s.io", "-n", NS)["items"]:
        owners = item["metadata"].get("ownerReferences") or []
        if any(o["kind"] == "PyTorchJob" and o.get("uid") == uid for o in owners):
            return item
    return None


def is_true(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    cond = condition(obj, kind)
    return cond if cond and cond["status"] == "True" else None


def job_suspended(kube) -> bool:
    job = get_json(kube, "pytorchjob", RUN, "-n", NS)
    return bool(job["spec"].get("runPolicy", {}).get("suspend"))


def preempt_and_readmit(kube, story: Story) -> None:
    """Step 3: a higher priority takes both GPUs, holds them a while, and goes."""
    story.at["preempted"] = time.monotonic()
    apply_objects(kube, preemptor(PREEMPTOR, NS, LOCAL_QUEUE, 2))
    evicted = eventually(
        lambda: is_true(run_workload(kube), "Evicted"), timeout=300, message="run evicted"
    )
    story.seen["evicted"] = evicted
    eventually(lambda: job_suspended(kube), timeout=120, message="the job suspended by Kueue")
    eventually(lambda: not pods_of(kube, NS, JOB_PODS), timeout=300, message="the run's pods gone")
    eventually(
        lambda: is_true(
            get_or_none(kube, "workloads.kueue.x-k8s.io", PREEMPTOR, "-n", NS), "Admitted"
        ),
        timeout=300,
        message="the preemptor admitted",
    )
    story.seen["requeued"] = condition(run_workload(kube), "Requeued")
    story.seen["suspended run"] = get_json(kube, "mdr", RUN, "-n", NS)
    # The controller leaves Kueue's suspend alone: it holds while the preemptor runs, through
    # the status writes the suspend caused (each one a reconcile of the run).
    time.sleep(15)
    story.seen["held"] = {
        "suspend": job_suspended(kube),
        "pods": pods_of(kube, NS, JOB_PODS),
        "phase": get_json(kube, "mdr", RUN, "-n", NS)["status"]["phase"],
    }
    story.at["preemptor deleted"] = time.monotonic()
    kube.kubectl("delete", "workloads.kueue.x-k8s.io", PREEMPTOR, "-n", NS)
    story.seen["admitted again"] = eventually(
        lambda: (a := is_true(run_workload(kube), "Admitted"))
        and a["lastTransitionTime"] >= evicted["lastTransitionTime"]
        and a,
        timeout=300,
        message="the run admitted again",
    )
    eventually(lambda: pods_of(kube, NS, JOB_PODS), timeout=300, message="the resumed pods")
    story.seen["preemption seconds"] = time.monotonic() - story.at["preempted"]


def training(watch: RunWatch, attempt: int) -> None:
    """Wait for the run's status to show ``attempt`` training before the stretch's checkpoint
    and stop: each stretch's checks read the stage Training from the watch, and the controller
    writes a run's progress at most once every --progress-interval, many checkpoints after
    the attempt's first iteration; the stop then comes one new checkpoint after it."""
    watch.wait(
        lambda s: s.get("attempt") == attempt and s.get("stage") == "Training",
        timeout=300,
        message=f"attempt {attempt}'s stage Training",
    )


@pytest.fixture(scope="module")
def story(kube, train_image, volumes, queue, controller_pod) -> Iterator[Story]:
    """The run, from before its creation to Succeeded."""
    spec = {k: v for k, v in run_values(train_image).items() if k != "runName"}
    spec.update(
        maxIter=MAX_ITER,
        steps=[MAX_ITER - PERIOD],
        extraOverrides={**spec["extraOverrides"], "SOLVER.CHECKPOINT_PERIOD": PERIOD},
        elastic={"minGpus": 1, "maxGpus": 2, "resize": "keep-batch"},
        kueue={"queueName": queue},
    )
    folder = volumes["output"] / RUN
    story = Story()
    watch = RunWatch(kube, NS, RUN)
    story.versions = watch.versions
    try:
        time.sleep(3)  # the watch established (a run made before it is in its first list)
        assert watch.proc.poll() is None, "the watch ended"
        story.at["created"] = time.monotonic()
        apply_objects(kube, mdr(RUN, NS, spec))
        # 1. Kueue admits the run (its quota fits) and the job trains to a checkpoint.
        story.seen["admitted"] = eventually(
            lambda: is_true(run_workload(kube), "Admitted"), timeout=300, message="run admitted"
        )
        training(watch, 1)
        new_checkpoint(folder, checkpoints(folder), "a first checkpoint")
        story.seen["first checkpoint"] = (watch.status(), (folder / "model_final.pth").exists())
        # 2. 2 -> 1 -> 2 GPUs, a checkpoint at each size.
        story.at["resized to 1"] = time.monotonic()
        story.seen["down"] = resize(kube, watch, 1, 2, 1)
        story.seen["1-GPU job"] = get_json(kube, "pytorchjob", RUN, "-n", NS)
        training(watch, 2)
        new_checkpoint(folder, checkpoints(folder), "a 1-GPU checkpoint")
        story.at["resized to 2"] = time.monotonic()
        story.seen["up"] = resize(kube, watch, 2, 3, 2)
        training(watch, 3)
        new_checkpoint(folder, checkpoints(folder), "a checkpoint of the 2-GPU job")
        story.seen["before preemption"] = (watch.status(), (folder / "model_final.pth").exists())
        # 3. Kueue preempts the run and admits it again.
        preempt_and_readmit(kube, story)
        # 4. It trains to the end; the status writes after Succeeded reach the watch too.
        watch.wait(
            lambda s: s.get("phase") in ("Succeeded", "Failed"), timeout=1200, message="the end"
        )
        if watch.status()["phase"] == "Succeeded":
            watch.wait(
                lambda s: s.get("stage") == "Succeeded"
                and (condition({"status": s}, "Training") or {}).get("status") == "False",
                timeout=60,
                message="the Stage Succeeded and Training over",
            )
        story.at["done"] = time.monotonic()
    finally:
        watch.stop()
        story.final = get_json(kube, "mdr", RUN, "-n", NS).get("status") or {}
        story.events = get_json(
            kube, "events", "-n", NS, "--field-selector", f"involvedObject.name={RUN}"
        )["items"]
        story.table = kube.kubectl("get", "mdr", RUN, "-n", NS).stdout.splitlines()[:2]
        story.master_log = kube.kubectl("logs", "-n", NS, f"{RUN}-master-0", check=False).stdout
        story.log = (folder / "log.txt").read_text() if (folder / "log.txt").is_file() else ""
        if (folder / "plan.json").is_file():
            story.plan = json.loads((folder / "plan.json").read_text())
        if (folder / "model_final.pth").is_file():
            story.model_final_bytes = (folder / "model_final.pth").stat().st_size
    took = story.at["done"] - story.at["created"]
    print(f"\nthe run: {took:.0f} s from its creation to Succeeded")
    print(f"resize 2 -> 1 GPUs: {story.seen['down']:.1f} s from the patch to the re-plan line")
    print(f"resize 1 -> 2 GPUs: {story.seen['up']:.1f} s from the patch to the re-plan line")
    print(f"preemption: {story.seen['preemption seconds']:.0f} s to the resumed job's pods")
    stretches = [f"{g['world_size']} GPUs {g['first_iter']}-{g['last_iter']}" for g in
                 story.plan.get("segments", [])]  # fmt: skip
    print(f"the stretches: {', '.join(stretches)} of {MAX_ITER} iterations")
    yield story
    kube.kubectl("delete", "mdr", RUN, "-n", NS, "--wait=false", check=False)


def passed_through(versions: list[tuple[float, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each (type, status, reason) of TYPES as the watch first delivered it, in that order."""
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    for arrived, obj in versions:
        for cond in (obj.get("status") or {}).get("conditions") or []:
            key = (cond["type"], cond["status"], cond.get("reason", ""))
            if cond["type"] in TYPES and key not in seen:
                seen[key] = {"key": key, "at": cond.get("lastTransitionTime"), "seen": arrived}
    return list(seen.values())


def stages_of(versions: list[tuple[float, dict[str, Any]]]) -> list[str]:
    """The stages the versions show, each once per change."""
    stages = [obj["status"].get("stage") for _t, obj in versions if obj.get("status")]
    return [s for i, s in enumerate(stages) if s and (i == 0 or s != stages[i - 1])]


def test_the_run_succeeds_with_the_planned_images(story: Story) -> None:
    assert story.final.get("phase") == "Succeeded", (story.final, story.master_log[-4000:])
    assert story.plan["images_seen"] == MAX_ITER * 4
    assert story.model_final_bytes > 0


def test_the_run_passes_through_its_conditions_in_order_with_their_times(story: Story) -> None:
    path = passed_through(story.versions)
    order = [f"{'/'.join(p['key'])} @ {p['at']}" for p in path]
    print("\nlifecycle, as the watch delivered it:\n  " + "\n  ".join(order))
    keys = [p["key"] for p in path]

    def first(kind: str, status: str, reason: str | None = None) -> int:
        for i, (k, s, r) in enumerate(keys):
            if (k, s) == (kind, status) and reason in (None, r):
                return i
        raise AssertionError(f"{kind}={status} {reason or ''} never seen: {order}")

    steps = [
        first("PodsScheduled", "True"),
        first("Initialized", "False"),
        first("Initialized", "True", "Loaded"),
        first("Training", "True", "FirstIteration"),
        first("Evaluating", "True") if ("Evaluating", "True", "Evaluating") in keys else None,
        first("Succeeded", "True"),
    ]
    taken = [i for i in steps if i is not None]
    assert taken == sorted(taken), order
    # The evaluation at the end was reported (True while it ran, or only its end if a flush
    # came after it) and training is over.
    assert any(k == "Evaluating" for k, _s, _r in keys), order
    assert first("Training", "False") > first("Training", "True")
    # The times of the path never go back.
    times = [parse_time(path[i]["at"]) for i in taken]
    assert times == sorted(times), order


def test_each_attempt_says_why_it_initializes_in_order(story: Story) -> None:
    """Initializing says why in the kubelet's and the trainer's words, in this order, in each
    of the four stretches (created, resized to 1, resized to 2, resumed after the preemption)."""
    for number, stretch in enumerate(story.stretches()):
        keys = [p["key"] for p in passed_through(stretch)]
        reasons = [r for k, s, r in keys if (k, s) == ("Initialized", "False")]
        assert reasons and all(r in INITIALIZING for r in reasons), (number, reasons)
        ranks = [INITIALIZING[r] for r in reasons]
        assert ranks == sorted(ranks), (number, reasons)


def test_the_first_attempts_startup_is_split_in_its_parts(story: Story) -> None:
    first = story.stretches()[0]
    startup = (first[-1][1].get("status") or {}).get("startup") or {}
    print(f"\nstartup of the first attempt: {startup}")
    for part in (
        "schedulingSeconds", "containerStartSeconds", "rendezvousSeconds", "dataModelSeconds",
        "firstIterationSeconds", "totalSeconds",
    ):  # fmt: skip
        assert isinstance(startup.get(part), int), startup
    assert startup["attempt"] == 1
    assert startup["totalSeconds"] >= startup["rendezvousSeconds"] + startup["dataModelSeconds"]


def test_once_an_attempt_trains_its_stage_goes_back_only_at_a_stop(story: Story) -> None:
    stages = stages_of(story.versions)
    print(f"\nstages: {stages}")
    assert stages[-1] == "Succeeded" and "Training" in stages and "Initializing" in stages
    for number, stretch in enumerate(story.stretches()):
        shown = stages_of(stretch)
        # From the stretch's first step before training (a stopped attempt's last stage may
        # still show until the controller writes), to its first Training.
        start = next((i for i, s in enumerate(shown) if s in BEFORE_TRAINING), 0)
        assert "Training" in shown[start:], (number, shown)
        after = shown[shown.index("Training", start) :]
        assert not BEFORE_TRAINING & set(after), (number, shown)
    header, row = story.table
    assert row[header.index("STAGE") :].split()[0] == "Succeeded"  # columns are aligned


def test_a_resize_to_one_gpu_and_back_makes_three_attempts_at_the_kept_batch(
    story: Story,
) -> None:
    status, final_saved = story.seen["first checkpoint"]
    assert status["gpus"] == 2 and status["attempt"] == 1 and not final_saved
    # The 1-GPU job has only a Master.
    assert list(story.seen["1-GPU job"]["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    st = story.final
    assert st["attempt"] == 3 and st["gpus"] == 2 and "resize" not in st, st
    assert [(s["attempt"], s["gpus"], s["reason"]) for s in st["segments"]] == [
        (1, 2, "Created"),
        (2, 1, "Resized"),
        (3, 2, "Resized"),
    ]
    assert all(s["globalBatch"] == 4 for s in st["segments"])  # keep-batch
    resized = [e["message"][:15] for e in story.events if e["reason"] == "Resized"]
    assert sorted(resized) == ["from 1 to 2 GPU", "from 2 to 1 GPU"]
    assert not [e for e in story.events if e["type"] == "Warning"], story.events
    header, row = story.table
    assert header.split()[:3] == ["NAME", "PHASE", "GPUS"] and row.split()[2] == "2"
    print(f"\nresize 2 -> 1 GPUs: {story.seen['down']:.1f} s from the patch to the re-plan line")
    print(f"resize 1 -> 2 GPUs: {story.seen['up']:.1f} s from the patch to the re-plan line")


def test_the_trainers_log_and_plan_show_each_replan(story: Story) -> None:
    # One log (rank 0 appends every attempt's): both re-plans; plan.json: a segment per start
    # (created, 1 GPU, 2 GPUs, resumed after the preemption) at the kept batch, their images
    # adding up to the planned total.
    log = story.log
    assert "images on 1 workers (was 2 workers" in log, log[-4000:]
    assert "images on 2 workers (was 1 workers" in log, log[-4000:]
    segments = story.plan["segments"]
    assert [s["world_size"] for s in segments] == [2, 1, 2, 2]
    assert [s["global_batch"] for s in segments] == [4, 4, 4, 4]
    assert [s["accumulation_steps"] for s in segments] == [1, 2, 1, 1]
    for before, after in itertools.pairwise(segments):
        assert after["images_start"] == before["images_end"], segments
    assert segments[-1]["images_end"] == MAX_ITER * 4


def test_kueue_preempts_the_run_and_the_controller_leaves_its_suspend_alone(
    story: Story,
) -> None:
    assert story.seen["admitted"]["status"] == "True"
    status, final_saved = story.seen["before preemption"]
    assert status["attempt"] == 3 and not final_saved  # preempted mid-run
    evicted = story.seen["evicted"]
    assert evicted["reason"] == "Preempted", evicted
    requeued = story.seen["requeued"]
    assert requeued and requeued["reason"] == "Preempted", requeued
    run = story.seen["suspended run"]
    assert run["status"]["phase"] == "Suspended", run["status"]
    assert is_true(run, "Suspended"), run["status"]
    # 15 s on, with the preemptor still admitted: still suspended, no pods, still Suspended.
    held = story.seen["held"]
    assert held["suspend"] and not held["pods"] and held["phase"] == "Suspended", held
    again = story.seen["admitted again"]
    assert again["lastTransitionTime"] >= evicted["lastTransitionTime"]


def test_the_preempted_run_resumes_at_equal_images_on_the_same_workers(story: Story) -> None:
    st = story.final
    # Kueue suspends and resumes the same job: no attempt and no segment of the run's status
    # came of the preemption (the three are the resizes'), and the status says it was
    # suspended and resumed.
    assert st["attempt"] == 3 and len(st["segments"]) == 3, st
    suspended = condition({"status": st}, "Suspended")
    evicted = story.seen["evicted"]
    assert (
        suspended["status"] == "False"
        and suspended["lastTransitionTime"] >= evicted["lastTransitionTime"]
    ), st["conditions"]
    # The trainer: a checkpoint at the iteration SIGTERM found at each of the three stops (the
    # preemption's the last), the resume at equal images on the same 2 workers (in the new
    # Master's log), the two segments around it adding up to the plan.
    saved = [
        int(line.split("at iteration ")[1].split()[0])
        for line in story.log.splitlines()
        if "after SIGTERM" in line and "at iteration " in line
    ]
    assert len(saved) == 3, story.log[-4000:]
    *_, one, two = story.plan["segments"]
    assert (one["world_size"], two["world_size"]) == (2, 2)
    assert one["global_batch"] == two["global_batch"] == 4
    assert one["last_iter"] == saved[-1] and one["images_end"] == (saved[-1] + 1) * 4
    assert two["images_start"] == one["images_end"] and two["first_iter"] == saved[-1] + 1
    assert two["images_end"] == story.plan["images_seen"] == MAX_ITER * 4
    line = f"Resuming after {one['images_end']:,} images on the same 2 workers"
    assert line in story.master_log, story.master_log[-4000:]
    print(f"\npreempted after iteration {saved[-1]}: {story.seen['preemption seconds']:.0f} s")
