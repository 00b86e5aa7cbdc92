"""The users' own command for real: `helm install` of the run chart on the real node, with
README.md's "Try it locally" commands, read from the README (tests/try_locally.py): its storage
(the `volumes` fixture), its run chart (the first test) and its operator and MegDetRun (the
controller pod's test) are run as written, against this session's cluster, and the images go
into the node the way `make cluster` loads them (cluster.local_images).

The training image this machine built (``imagebuild.build``'s ``train-ci``: the Dockerfile's
``train`` stage from package registries) is imported into the real node's containerd; the
Kubeflow training operator creates the Master and Worker pods; the kubelet runs them; the Worker's
init container and torchrun find ``<run>-master-0`` through CoreDNS; the two pods form a gloo
world, train the tiny detector on the shapes dataset held on a PersistentVolume, evaluate it with
pycocotools and write ``model_final.pth`` and ``metrics.json`` to the shared output volume. The
namespace enforces the ``restricted`` Pod Security level, so the API server admitted every pod.

The node advertises ``nvidia.com/gpu`` by a status patch; it has no GPU, so these pods run the
trainer on the CPU (the tiny config's ``MODEL.DEVICE: cpu``) over gloo.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import try_locally
import yaml
from e2e_helpers import (
    E2E_ROOT,
    EXAMPLE,
    apply_objects,
    eventually,
    get_json,
    helm,
    mdr,
    namespace,
    pods_of,
)

from cluster.node import NODE_NAME, ctr, pod_placement
from megdet.trainer.evaluation import METRICS_FILE
from megdet.trainer.ownership import STAMP_FILE

NS = next(yaml.safe_load_all((EXAMPLE / "volumes.yaml").read_text()))["metadata"]["name"]
RELEASE = "tiny"
#: The image's user (Dockerfile: USER 10001); a hostPath volume gets no fsGroup, so the output
#: folder belongs to it as it would on an NFS export made for the run.
IMAGE_UID = 10001
#: The tiny run: 2 pods x 1 process, 2 images per process (global batch 4).
MAX_ITER = 30
#: Real pods on 2 shared cores, and the first test also imports the 3 GB training image.
#: `make test` runs them; `make test-real-pods` runs this module and the shared run alone.
pytestmark = [pytest.mark.timeout(2400), pytest.mark.real_pods]


def host_volume(name: str, ns: str, path: Path) -> list[dict[str, Any]]:
    """A hostPath PersistentVolume on the real node, pre-bound to the claim ``name`` in ``ns``
    (the pods mount the claim: `restricted` allows persistentVolumeClaim, not hostPath)."""
    pv = f"{ns}-{name}"
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "megdet-real-node",
                "claimRef": {"namespace": ns, "name": name},
                "hostPath": {"path": str(path), "type": "Directory"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": [NODE_NAME],
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "megdet-real-node",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]


@pytest.fixture(scope="module")
def volumes(kube, real_node) -> Iterator[dict[str, Path]]:
    """The shapes dataset and an empty output folder, each on a PersistentVolume: README's
    storage commands, as written (their folders are fixed paths under /var/lib, which only root
    can write, so no other user can plant a link there first)."""
    pvs = [d for d in yaml.safe_load_all((EXAMPLE / "volumes.yaml").read_text()) if
           d["kind"] == "PersistentVolume"]  # fmt: skip
    paths = {pv["spec"]["claimRef"]["name"]: Path(pv["spec"]["hostPath"]["path"]) for pv in pvs}
    folders = {path.parent for path in paths.values()}
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    for command in try_locally.paragraphs()["storage"]:
        try_locally.run(command, kube.root)
    eventually(
        lambda: all(
            get_json(kube, "pvc", claim, "-n", NS)["status"].get("phase") == "Bound"
            for claim in paths
        ),
        message="both claims bound to their volumes",
    )
    yield paths
    kube.kubectl("delete", "namespace", NS, "--wait=false", check=False)
    kube.kubectl("delete", "pv", *(pv["metadata"]["name"] for pv in pvs), "--wait=false",
                 check=False)  # fmt: skip
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def shapes_volumes(kube, ns: str) -> Iterator[dict[str, Path]]:
    """The body of a ``volumes`` fixture for namespace ``ns`` (made with the `restricted`
    Pod Security level): yields the folders, then deletes the namespace and volumes."""
    from megdet.trainer.shapes import make_shapes

    folder = E2E_ROOT / "volumes" / ns
    shutil.rmtree(folder, ignore_errors=True)
    data, output = folder / "data", folder / "output"
    make_shapes(data, train=32, val=8, seed=1)
    output.mkdir(parents=True)
    os.chown(output, IMAGE_UID, IMAGE_UID)
    for path in (folder, data):
        path.chmod(0o755)
    ns = namespace(kube, ns, {"pod-security.kubernetes.io/enforce": "restricted"})
    apply_objects(kube, *host_volume("data", ns, data), *host_volume("output", ns, output))
    eventually(
        lambda: all(
            get_json(kube, "pvc", claim, "-n", ns)["status"].get("phase") == "Bound"
            for claim in ("data", "output")
        ),
        message="both claims bound to their volumes",
    )
    yield {"data": data, "output": output}
    kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    kube.kubectl("delete", "pv", f"{ns}-data", f"{ns}-output", "--wait=false", check=False)


def run_values(image: str) -> dict[str, Any]:
    """The chart's values for the tiny run on the real node: README's (examples/local), with
    ``image``."""
    values = yaml.safe_load((EXAMPLE / "values.yaml").read_text())
    repository, tag = image.rsplit(":", 1)
    values["image"] = {**values["image"], "repository": repository, "tag": tag}
    assert values["runName"] == RELEASE and values["maxIter"] == MAX_ITER
    assert {k: values[k] for k in pod_placement()} == pod_placement()
    return values


#: The conditions that end a job of each kind (the training operator's, Trainer v2's).
FINISHED = {"pytorchjob": ("Succeeded", "Failed"), "trainjob": ("Complete", "Failed")}


def job_condition(kube, ns: str, name: str, kind: str = "pytorchjob") -> str | None:
    """The condition that ended the job (one of :data:`FINISHED`), None while it runs."""
    job = get_json(kube, kind, name, "-n", ns)
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond["type"] in FINISHED[kind] and cond["status"] == "True":
            return cond["type"]
    return None


def test_helm_install_trains_on_the_real_node_to_succeeded(kube, train_image, volumes) -> None:
    # One run shows two things: the release starts on 1 GPU, is uninstalled after a checkpoint
    # (the kubelet's SIGTERM: the trainer saves where it stops), and is installed again with
    # gpus 2 over the same output volume; the trainer continues it at equal images seen, and the
    # second job trains to Succeeded on two real pods. The second install, its wait, logs and
    # report are README's run-chart commands as written; the first is README's install on 1 GPU.
    run_dir = volumes["output"] / RELEASE
    install, *after = try_locally.paragraphs()["run chart"]
    assert install.startswith(f"helm install {RELEASE} charts/megdet -n {NS} "), install
    try_locally.run(f"{install} --set gpus=1", kube.root)
    first = get_json(kube, "pytorchjobs", "-n", NS)["items"][0]["metadata"]["name"]
    # Batch 2 on 1 GPU: the checkpoint period of 10 reference iterations is 20 of these.
    eventually(
        lambda: (run_dir / "model_0000019.pth").exists() or job_condition(kube, NS, first),
        timeout=1200, interval=2, message="the 1-GPU run's first checkpoint",
    )  # fmt: skip
    assert not (run_dir / "model_final.pth").exists()
    helm(kube, "uninstall", RELEASE, "-n", NS, "--wait", "--timeout=300s", timeout=360)
    eventually(
        lambda: not pods_of(kube, NS, f"training.kubeflow.org/job-name={first}"),
        timeout=300, message="the 1-GPU run's pods gone",
    )  # fmt: skip
    try_locally.run(install, kube.root)
    job = get_json(kube, "pytorchjobs", "-n", NS)["items"][0]["metadata"]["name"]

    def failed() -> str | None:
        return job_condition(kube, NS, job) == "Failed" and f"the job {job} failed"

    try:
        said, problem = [try_locally.run(c, kube.root, 1200, failed).stdout for c in after], ""
    except AssertionError as err:
        said, problem = [], str(err)
    outcome = job_condition(kube, NS, job)
    pods = pods_of(kube, NS, f"training.kubeflow.org/job-name={job}")
    logs = {
        p["metadata"]["name"]: kube.kubectl(
            "logs", "-n", NS, p["metadata"]["name"], "--all-containers", check=False
        ).stdout
        for p in pods
    }
    assert outcome == "Succeeded" and not problem, problem + json.dumps(logs, indent=1)[-6000:]

    # Two real pods on the real node, admitted under `restricted` and run by the kubelet.
    assert sorted(p["metadata"]["labels"]["training.kubeflow.org/replica-type"] for p in pods) == [
        "master",
        "worker",
    ]
    for p in pods:
        assert p["spec"]["nodeName"] == NODE_NAME
        assert p["status"]["phase"] == "Succeeded"
        (state,) = [c["state"] for c in p["status"]["containerStatuses"]]
        assert state["terminated"]["exitCode"] == 0
    # The Worker's init container waited for the Master's name in CoreDNS, then torchrun found it.
    worker = next(p for p in pods if p["metadata"]["labels"]["training.kubeflow.org/replica-type"]
                  == "worker")  # fmt: skip
    (init,) = worker["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0

    # `kubectl logs` of the Master shows the loss; the run's files are on the output volume.
    master_log = logs[f"{job}-master-0"]
    assert "total_loss" in master_log, master_log[-3000:]
    # README's `kubectl logs | grep` showed loss lines, and `megdet report` the run's AP.
    assert [c for c in after if c.startswith("kubectl logs")] and "total_loss" in "".join(said)
    assert "AP" in said[-1] and after[-1].startswith(".venv/bin/megdet report"), said[-1]
    assert (run_dir / "model_final.pth").stat().st_size > 0
    metrics = json.loads((run_dir / METRICS_FILE).read_text())
    ap = metrics["bbox"]["AP"]
    assert isinstance(ap, int | float) and 0 <= ap <= 100
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["world_size"] == 2 and plan["global_batch"] == 4
    # The re-install continued the 1-GPU segment: batch 2 could not be kept by 2 GPUs x 2 images,
    # so the rest was rescaled (batch 4, the linear rule's lr), and the images add up to the plan.
    one, two = plan["segments"]
    assert (one["world_size"], one["global_batch"], one["lr"]) == (1, 2, 0.005)
    assert (two["world_size"], two["global_batch"], two["lr"], two["resize"]) == (
        2, 4, 0.01, "rescale"
    )  # fmt: skip
    assert two["images_start"] == one["images_end"] >= 20 * 2
    assert two["images_end"] == plan["images_seen"]
    assert abs(two["images_end"] - MAX_ITER * 4) <= 4 / 2  # within half a batch of the plan
    assert f"Resuming after {one['images_end']:,} images on 2 workers (was 1 workers" in (
        master_log
    )
    assert (run_dir / STAMP_FILE).is_file()


#: README's MegDetRun (examples/local/megdetrun.yaml).
RUN = yaml.safe_load((EXAMPLE / "megdetrun.yaml").read_text())["metadata"]["name"]


def test_a_megdetrun_trains_through_the_controller_pod(
    kube, train_image, volumes, controller_pod
) -> None:
    # The controller is a real container: the kubelet ran the controller image as its non-root
    # user with a read-only root filesystem (the chart's securityContext).
    (status,) = controller_pod["status"]["containerStatuses"]
    assert status["ready"] and "running" in status["state"]
    (container,) = controller_pod["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The chart's allocator (controller.allocator: jemalloc) is what the process runs on: the
    # loader preloaded the image's library (a missing one is only a warning on stderr).
    maps = kube.kubectl(
        "exec", "-n", controller_pod["metadata"]["namespace"], controller_pod["metadata"]["name"],
        "--", "cat", "/proc/1/maps",
    ).stdout  # fmt: skip
    assert "libjemalloc.so.2" in maps
    # README's MegDetRun: its spec is README's run values (with the image built here).
    example = yaml.safe_load((EXAMPLE / "megdetrun.yaml").read_text())
    assert example["metadata"]["namespace"] == NS
    assert example["spec"] == {k: v for k, v in run_values(train_image).items() if k != "runName"}

    def failed() -> str | None:
        phase = get_json(kube, "mdr", RUN, "-n", NS)["status"]["phase"]
        return phase == "Failed" and f"the run {RUN} failed"

    said = [
        try_locally.run(command, kube.root, 1200, failed).stdout
        for command in try_locally.paragraphs()["operator"][1:]
    ]
    assert RUN in said[-1] and "Succeeded" in said[-1], said[-1]  # `kubectl get mdr -n ...`

    def progress() -> dict[str, Any]:
        run = get_json(kube, "mdr", RUN, "-n", NS)
        return (run.get("status") or {}).get("progress") or {}

    done = eventually(
        lambda: (p := progress()).get("percent") == 100 and p.get("ap") is not None and p,
        timeout=1200,
        interval=5,
        message="status.progress at 100 % with the final AP",
    )
    metrics = json.loads((volumes["output"] / RUN / METRICS_FILE).read_text())
    assert done["ap"] == pytest.approx(metrics["bbox"]["AP"], abs=1e-3)
    assert done["iteration"] == MAX_ITER
    eventually(
        lambda: get_json(kube, "mdr", RUN, "-n", NS)["status"].get("phase") == "Succeeded",
        timeout=300,
        interval=2,
        message="the run's phase Succeeded",
    )
    # The run's summary stays in its status (controller/run_summary.py): the final report's
    # numbers, the controller's own facts, the trainer's last attempt from first iteration on.
    summary = eventually(
        lambda: (s := get_json(kube, "mdr", RUN, "-n", NS)["status"].get("summary") or {})
        .get("iteration") == MAX_ITER and s,
        timeout=300,
        interval=2,
        message="status.summary with the final report",
    )  # fmt: skip
    assert (summary["phase"], summary["target"], summary["attempt"]) == (
        "Succeeded", "pytorchjob", 1,
    )  # fmt: skip
    assert summary["ap"] == pytest.approx(metrics["bbox"]["AP"], abs=1e-3)
    assert summary["imagesSeen"] == summary["plannedImages"] == done["imagesSeen"]
    assert summary["durationSeconds"] >= summary["trainingSeconds"] > 0
    assert summary["startupSeconds"] > 0 and summary["finishingSeconds"] >= 0
    # The trainer's final report carried its run report's totals (trainer/report.py).
    report = json.loads((volumes["output"] / RUN / "report.json").read_text())
    assert summary["trainerAttempts"] == report["attempt_count"] == 1
    assert summary["wallSeconds"] == round(report["wall_time"]["total_s"])
    header, row = kube.kubectl("get", "mdr", RUN, "-n", NS).stdout.splitlines()[:2]
    assert header.split()[6:9] == ["PROGRESS", "ETA", "AP"]
    cells = row.split()
    assert cells[6] == "100"
    assert float(cells[8]) == pytest.approx(metrics["bbox"]["AP"], abs=0.1)
    assert (volumes["output"] / RUN / "model_final.pth").stat().st_size > 0


def test_the_output_volumes_stamp_refuses_a_second_run(
    kube, train_image, volumes, controller_pod
) -> None:
    """The first MegDetRun is deleted; its folder on the volume keeps its stamp. A new run
    pointed at that folder (spec.runName) starts real pods, and the trainer in them refuses to
    write into another run's folder: the job fails (ExitCode: exit 2 is not retried), the pod's
    log names the owner and the fix, and nothing in the folder changed."""
    folder = volumes["output"] / RUN
    stamp = (folder / STAMP_FILE).read_text()
    files = sorted(p.name for p in folder.iterdir())
    kube.kubectl("delete", "mdr", RUN, "-n", NS, "--wait=true", timeout=180)
    other = "tiny-other"
    spec = {
        **{k: v for k, v in run_values(train_image).items() if k != "runName"},
        "runName": RUN,
        "restartPolicy": "ExitCode",
    }
    apply_objects(kube, mdr(other, NS, spec))

    def failed() -> dict | None:
        run = get_json(kube, "mdr", other, "-n", NS)
        return run if (run.get("status") or {}).get("phase") == "Failed" else None

    run = eventually(failed, timeout=900, interval=5, message="the second run to fail")
    log = kube.kubectl(
        "logs", "-n", NS, "-l", f"app.kubernetes.io/instance={other}", "--tail=-1",
        check=False,
    ).stdout  # fmt: skip
    assert f"belongs to run {RUN!r}" in log, (log[-4000:], run["status"])
    assert "refusing to write into it" in log and "spec.resumeFrom" in log
    assert (folder / STAMP_FILE).read_text() == stamp
    assert sorted(p.name for p in folder.iterdir()) == files
    kube.kubectl("delete", "mdr", other, "-n", NS, "--wait=false", check=False)


def test_a_run_whose_image_cannot_be_had_says_the_kubelets_reason(
    kube, volumes, controller_pod
) -> None:
    """A MegDetRun with an image tag no node has (pull policy Never: nothing is pulled here):
    the training operator creates the pods, the kubelet cannot start them
    (ErrImageNeverPull), and the controller pod puts the kubelet's reason and message on the
    run as PodsStarted=False with a Warning event; the phase stays the job's."""
    run = "tiny-bad-image"
    spec = {
        k: v for k, v in run_values("ghcr.io/megdet/megdet:no-such-tag").items() if k != "runName"
    }
    apply_objects(kube, mdr(run, NS, spec))

    def pods_started() -> dict | None:
        status = get_json(kube, "mdr", run, "-n", NS).get("status") or {}
        cond = next((c for c in status.get("conditions") or [] if c["type"] == "PodsStarted"), None)
        return cond if cond and cond["status"] == "False" else None

    cond = eventually(pods_started, timeout=300, interval=2, message="PodsStarted=False")
    assert cond["reason"] == "ErrImageNeverPull", cond
    assert "ghcr.io/megdet/megdet:no-such-tag" in cond["message"], cond
    assert "pull policy of Never" in cond["message"], cond
    status = get_json(kube, "mdr", run, "-n", NS)["status"]
    assert status["phase"] not in ("Failed", "Succeeded"), status
    events = [
        e
        for e in get_json(kube, "events", "-n", NS)["items"]
        if e["involvedObject"].get("name") == run and e["reason"] == "ErrImageNeverPull"
    ]
    assert events and all(e["type"] == "Warning" for e in events), events
    kube.kubectl("delete", "mdr", run, "-n", NS, "--wait=false", check=False)


#: The TrainJob's iterations (one checkpoint period of README's values).
TRAINJOB_ITER = 10


#: Trainer's webhook reads the runtime from its informer cache, which can lag the chart's
#: pre-install hook that created it (docs/trainer-v2.md, "Creation order"): the one refusal
#: that another try heals, as for the controller (controller/kubeapi.py HEALING_REFUSALS).
RUNTIME_LAG = "specified trainingRuntime must be created before the TrainJob is created"


def install_past_the_runtime_lag(kube, release: str, values: Path) -> int:
    """``helm install`` the run chart, then what docs/trainer-v2.md tells a user to do while
    Trainer's webhook refuses the TrainJob for a runtime its cache does not hold yet: ``helm
    upgrade --install`` with the same values until it is admitted (any other refusal fails).
    Returns the tries it took."""
    deadline = time.monotonic() + 120
    tries = 0
    while True:
        tries += 1
        verb = ("install",) if tries == 1 else ("upgrade", "--install")
        args = (*verb, release, "charts/megdet", "-n", NS, "-f", str(values))
        done = helm(kube, *args, check=False)
        if done.returncode == 0:
            break
        if RUNTIME_LAG not in done.stderr or time.monotonic() > deadline:
            raise AssertionError(f"helm {' '.join(args)} (try {tries}): {done.stderr}")
        time.sleep(2)
    return tries


def test_the_charts_trainjob_trains_on_the_real_node_through_jobset(
    kube, train_image, volumes, tmp_path
) -> None:
    """Kubeflow Trainer v2: the chart's TrainingRuntime and TrainJob; Trainer makes the JobSet,
    JobSet the Jobs and the headless Service the pods find each other by, the kubelet runs
    them: two real pods train to Complete."""
    kube.start_trainer_v2()
    release = "tiny-tj"
    values = tmp_path / "values.yaml"
    # 10 iterations, not README's 30: what this shows is the path through Trainer and JobSet
    # to Complete, which the schedule's length does not change.
    values.write_text(
        yaml.safe_dump(
            {**run_values(train_image), "target": "trainjob", "runName": release,
             "maxIter": TRAINJOB_ITER, "steps": [TRAINJOB_ITER - 2]}
        )
    )  # fmt: skip
    tries = install_past_the_runtime_lag(kube, release, values)
    print(f"\nhelm install of the TrainJob run: admitted at try {tries}")
    (job,) = [
        j["metadata"]["name"]
        for j in get_json(kube, "trainjobs", "-n", NS)["items"]
        if j["metadata"]["labels"].get("app.kubernetes.io/instance") == release
    ]
    selector = f"jobset.sigs.k8s.io/jobset-name={job}"
    outcome = eventually(
        lambda: job_condition(kube, NS, job, "trainjob"), timeout=1200, interval=5,
        message="the TrainJob to finish",
    )  # fmt: skip
    pods = pods_of(kube, NS, selector)
    logs = {
        p["metadata"]["name"]: kube.kubectl(
            "logs", "-n", NS, p["metadata"]["name"], check=False
        ).stdout
        for p in pods
    }
    tails = {name: text[-3000:] for name, text in logs.items()}
    assert outcome == "Complete", json.dumps(tails, indent=1)
    assert len(pods) == 2 and all(p["spec"]["nodeName"] == NODE_NAME for p in pods)
    assert all(p["status"]["phase"] == "Succeeded" for p in pods)
    # The loss is logged while training, long before the evaluation that ends the log.
    assert any("total_loss" in text for text in logs.values()), tails
    run_dir = volumes["output"] / release
    assert (run_dir / "model_final.pth").stat().st_size > 0
    metrics = json.loads((run_dir / METRICS_FILE).read_text())
    assert 0 <= metrics["bbox"]["AP"] <= 100
    assert json.loads((run_dir / "plan.json").read_text())["world_size"] == 2


def checkpoints(folder: Path) -> list[int]:
    """The iterations of the periodic and SIGTERM checkpoints in a run folder."""
    found = []
    for path in folder.glob("model_*.pth"):
        stem = path.stem.removeprefix("model_")
        if stem.isdigit():
            found.append(int(stem))
    return sorted(found)


#: The fault run: 30 iterations, a checkpoint every 5; the SIGKILL comes after the first
#: checkpoint, the delete after the first one the resumed round writes (20 iterations left, for
#: the SIGTERM to land before the run ends: at about 0.5 s an iteration it came 2 after).
LONG_ITER, PERIOD = 30, 5


def start_long_run(kube, image: str, volumes, release: str, tmp_path: Path) -> tuple[str, Path]:
    """`helm install` of the fault run; returns (job name, run folder) once its first periodic
    checkpoint is on the volume."""
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                **run_values(image),
                "runName": release,
                "maxIter": LONG_ITER,
                "steps": [LONG_ITER - PERIOD],
                "extraOverrides": {"SOLVER.CHECKPOINT_PERIOD": PERIOD, "SEED": 7},
            }
        )
    )
    helm(kube, "install", release, "charts/megdet", "-n", NS, "-f", str(values))
    job = next(
        j["metadata"]["name"]
        for j in get_json(kube, "pytorchjobs", "-n", NS)["items"]
        if j["metadata"]["labels"].get("app.kubernetes.io/instance") == release
    )
    run_dir = volumes["output"] / release
    eventually(
        lambda: checkpoints(run_dir), timeout=900, interval=1, message="the first checkpoint"
    )  # fmt: skip
    return job, run_dir


@dataclass
class FaultedRun:
    """What the fault run recorded: the newest checkpoint before each fault, the killed
    container's status after its restart, the Worker pod before and after its delete, the
    job's outcome and the Master's log (the Master is never stopped: one log for both)."""

    run_dir: Path
    before_kill: int
    after_kill: dict[str, Any]
    before_delete: int
    deleted: dict[str, Any]
    recreated: dict[str, Any]
    outcome: str | None
    master_log: str


@pytest.fixture(scope="module")
def faulted_run(kube, real_node, train_image, volumes, tmp_path_factory) -> FaultedRun:
    """One run, two faults one after the other (one run instead of one each): the Worker's
    container killed with SIGKILL after the first periodic checkpoint; once the resumed round
    has written a newer checkpoint, the Worker pod deleted (SIGTERM); then the run to its end."""
    release = "tiny-faults"
    job, run_dir = start_long_run(
        kube, train_image, volumes, release, tmp_path_factory.mktemp("faults")
    )
    pod_name = f"{job}-worker-0"
    (status,) = get_json(kube, "pod", pod_name, "-n", NS)["status"]["containerStatuses"]
    container_id = status["containerID"].removeprefix("containerd://")
    before_kill = max(checkpoints(run_dir))
    killed = ctr(real_node.socket, "tasks", "kill", "--signal", "SIGKILL", container_id)
    assert killed.returncode == 0, killed.stderr

    def restarted() -> dict | None:
        (st,) = get_json(kube, "pod", pod_name, "-n", NS)["status"]["containerStatuses"]
        return st if st.get("restartCount", 0) >= 1 else None

    after_kill = eventually(restarted, timeout=300, interval=2, message="the container restarted")
    before_delete = eventually(
        lambda: (newest := max(checkpoints(run_dir))) > before_kill and newest,
        timeout=900, interval=1, message="a checkpoint of the resumed round",
    )  # fmt: skip
    deleted = get_json(kube, "pod", pod_name, "-n", NS)
    kube.kubectl("delete", "pod", pod_name, "-n", NS, "--wait=true", timeout=180)
    recreated = eventually(
        lambda: (p := get_json(kube, "pod", pod_name, "-n", NS))["metadata"]["uid"]
        != deleted["metadata"]["uid"] and p,
        timeout=300, interval=2, message="the operator to create the Worker pod again",
    )  # fmt: skip
    outcome = eventually(
        lambda: job_condition(kube, NS, job), timeout=1200, interval=5,
        message="the job to finish after the faults",
    )  # fmt: skip
    master_log = kube.kubectl("logs", "-n", NS, f"{job}-master-0", check=False).stdout
    return FaultedRun(
        run_dir, before_kill, after_kill, before_delete, deleted, recreated, outcome, master_log
    )


def resumed_from(master_log: str) -> list[int]:
    """The iterations of the checkpoints each new round resumed from, in order."""
    return [
        int(line.rsplit("model_", 1)[1].split(".pth")[0])
        for line in master_log.splitlines()
        if "Resuming from" in line and "model_" in line
    ]


def test_a_worker_killed_with_sigkill_restarts_and_resumes(faulted_run: FaultedRun) -> None:
    """SIGKILL of the Worker's container (the runtime's own kill, as the OOM killer or a node
    agent does it): no checkpoint is written, the kubelet starts the container again (the
    operator's restartPolicy OnFailure), torchrun on the Master starts a new round, and the run
    resumes from the newest periodic checkpoint: at most one checkpoint interval is repeated."""
    run = faulted_run
    assert run.before_kill < LONG_ITER - PERIOD, "the run got too far before the kill"
    assert run.after_kill["lastState"]["terminated"]["exitCode"] == 137
    assert run.outcome == "Succeeded", run.master_log[-6000:]
    resumed = resumed_from(run.master_log)
    assert resumed, run.master_log[-4000:]
    # The first new round started from a checkpoint at least as new as the one before the kill.
    assert resumed[0] >= run.before_kill
    assert (run.run_dir / "model_final.pth").stat().st_size > 0


def test_a_deleted_worker_pod_checkpoints_and_the_run_resumes(faulted_run: FaultedRun) -> None:
    """`kubectl delete pod` of the Worker mid-run: the kubelet sends SIGTERM, the trainer's ranks
    agree on a last step and rank 0 writes a checkpoint within the grace period; the training
    operator creates the pod again, torchrun starts a new round, and the run resumes from that
    checkpoint: at most the steps since the newest checkpoint before the delete are repeated."""
    run = faulted_run
    assert run.before_delete < LONG_ITER - PERIOD, "the run got too far before the delete"
    assert run.recreated["spec"]["nodeName"] == NODE_NAME
    assert run.outcome == "Succeeded", run.master_log[-6000:]
    saved = [
        int(line.split("at iteration ")[1].split()[0])
        for line in run.master_log.splitlines()
        if "after SIGTERM" in line and "at iteration " in line
    ]
    assert saved, f"no checkpoint after SIGTERM in the Master's log: {run.master_log[-4000:]}"
    # The SIGTERM checkpoint is at or after the newest periodic one seen before the delete, so
    # the new round repeats no step that had been checkpointed; that round resumed from it.
    assert saved[0] >= run.before_delete
    assert resumed_from(run.master_log)[-1] == saved[0]
    assert f"Resuming from /output/tiny-faults/model_{saved[0]:07d}.pth" in run.master_log
    assert (run.run_dir / "model_final.pth").stat().st_size > 0
