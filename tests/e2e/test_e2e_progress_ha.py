"""Progress reporting with the operator chart's default install on the real control plane:
two replicas (two `megdet controller` processes on the host with the Deployment's args, each
playing one of the Deployment's pods, logged in as the chart's ServiceAccount), a failover, the
tokens the API server binds to pods, and the CA ConfigMap a namespace editor changes.

- Both replicas answer 200 and write status.progress, whichever kopf's peering lets act (as
  Kubeflow Trainer's status server runs on every replica); both pods are behind the progress
  Service (its EndpointSlice); a late, older report never replaces a newer one; an evaluation
  reported to the replica that does not act is announced once (one Evaluated event).
- Both serve the certificate of the shared Secret; after the acting one stops, the other goes
  on serving with the same CA, and the pods' CA ConfigMap is unchanged.
- A pod named as the run's but not of its job, an old run's token after the run is created
  again, and a token for the old audience bound to the new run's pod: all 403.
- The CA ConfigMap edited or deleted: written back.
- Every request either process made was allowed by the chart's RBAC (audit log).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from e2e_helpers import (
    CONTROLLER_USER,
    OPERATOR_NAMESPACE,
    ControllerProcess,
    apply_objects,
    eventually,
    get_json,
    get_or_none,
    mdr,
    namespace,
    pods_of,
    token_audience,
)

from megdet import progress as protocol
from tests.json_http import post_json

NS = "progress-ha-e2e"
RUN = "ha-run"
SERVICE = "megdet-operator-progress"
SECRET = "megdet-operator-progress-ca"


@pytest.fixture(scope="module")
def replicas(kube, controller, tmp_path_factory):
    """(acting, other): the session's single controller stopped, two processes started with
    priorities 200 and 100, each as one of the Deployment's two pods, writing progress at most
    once a second."""
    controller.stop()
    selector = "app.kubernetes.io/name=megdet-operator,app.kubernetes.io/component=controller"
    pods = eventually(
        lambda: (p := pods_of(kube, OPERATOR_NAMESPACE, selector)) and len(p) == 2 and p,
        message="the Deployment's two pods",
    )
    names = sorted(p["metadata"]["name"] for p in pods)
    procs = []
    for name, priority in zip(names, (200, 100), strict=True):
        proc = ControllerProcess(
            kube,
            tmp_path_factory.mktemp(f"replica-{priority}"),
            pod_id=name,
            extra_args=(f"--priority={priority}", "--progress-interval=1"),
        )
        proc.start()
        procs.append(proc)
    yield procs
    for proc in procs:
        proc.stop()
    controller.start()


def secret_ca(kube) -> str:
    import base64

    secret = get_json(kube, "secret", SECRET, "-n", OPERATOR_NAMESPACE)
    return base64.b64decode(secret["data"]["ca.crt"]).decode()


def post(proc: ControllerProcess, ca: str, run: str, token: str, iteration: int,
         at: float | None = None, **more: Any) -> tuple[int, Any]:  # fmt: skip
    """A report to ``proc``'s endpoint (``at``: its time, default now; ``more``: Progress
    fields), verifying its certificate with ``ca`` (raises ssl.SSLError if the certificate is
    not the CA's)."""
    when = protocol.format_time(time.time() if at is None else at)
    report = protocol.Progress(iteration=iteration, max_iter=1000, updated_time=when, **more)
    path = protocol.run_status_path(NS, run)
    body = protocol.to_request(report)
    status, data = post_json(proc.progress_port, ca, path, token, body, timeout=20)
    return status, json.loads(data) if data else None


def token(kube, audience: str, pod: str) -> str:
    return kube.kubectl(
        "create", "token", "default", "-n", NS, f"--audience={audience}",
        "--bound-object-kind=Pod", f"--bound-object-name={pod}",
    ).stdout.strip()  # fmt: skip


def run_pod(kube, run: str, uid: str | None = None) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for pod in pods_of(kube, NS, f"training.kubeflow.org/job-name={run}"):
            owner = get_json(kube, "pytorchjob", run, "-n", NS)["metadata"]["uid"]
            refs = pod["metadata"].get("ownerReferences") or []
            if any(r["uid"] == owner for r in refs) and (uid is None or uid in token_audience(pod)):
                return pod
        return None

    return eventually(found, timeout=120, message=f"the pod of {run}")


def iteration(kube, run: str) -> int | None:
    status = get_json(kube, "mdr", run, "-n", NS).get("status") or {}
    return (status.get("progress") or {}).get("iteration")


def evaluated(kube, run: str) -> list[dict[str, Any]]:
    return get_json(kube, "events", "-n", NS, "--field-selector",
                    f"involvedObject.name={run},reason=Evaluated")["items"]  # fmt: skip


def endpoint_pods(kube) -> set[str]:
    slices = get_json(
        kube, "endpointslices", "-n", OPERATOR_NAMESPACE, "-l",
        f"kubernetes.io/service-name={SERVICE}",
    )["items"]  # fmt: skip
    return {
        (e.get("targetRef") or {}).get("name") for s in slices for e in s.get("endpoints") or []
    }


def test_both_replicas_serve_one_stops_the_ca_stays_and_tokens_are_bound(kube, replicas) -> None:
    acting, other = replicas
    ns = namespace(kube, NS)
    apply_objects(kube, mdr(RUN, ns, {"gpus": 8}))
    pod = run_pod(kube, RUN)
    good = token(kube, token_audience(pod), pod["metadata"]["name"])
    ca = secret_ca(kube)
    published = eventually(
        lambda: get_or_none(kube, "configmap", "megdet-progress-ca", "-n", NS),
        message="the CA ConfigMap",
    )
    assert published["data"]["ca.crt"] == ca  # the Secret's CA is what the pods trust

    # Both replicas serve (the one kopf does not let act too), with the Secret's certificate.
    now = time.time()
    assert eventually(lambda: post(other, ca, RUN, good, 10, now - 20)[0] == 200, timeout=60,
                      message="the replica that does not act to accept")  # fmt: skip
    eventually(lambda: iteration(kube, RUN) == 10, timeout=30, message="its status.progress")
    assert post(acting, ca, RUN, good, 30, now)[0] == 200
    eventually(lambda: iteration(kube, RUN) == 30, timeout=30, message="the acting one's write")
    # A late, older report to the other replica: accepted, never written over the newer one.
    assert post(other, ca, RUN, good, 20, now - 10)[0] == 200
    time.sleep(4)  # --progress-interval=1 (the replicas above): its flush is long past
    assert iteration(kube, RUN) == 30
    # An evaluation reported to the replica that does not act: announced once, from the run's
    # watch on the acting one.
    assert post(other, ca, RUN, good, 40, now + 1, eval_iteration=40, ap=12.5, ap50=30.0)[0] == 200
    (event,) = eventually(lambda: evaluated(kube, RUN), timeout=30, message="Evaluated")
    assert "iteration 40: AP 12.50" in event["message"]
    # The progress Service reaches both replicas' pods.
    eventually(lambda: endpoint_pods(kube) == {acting.pod_id, other.pod_id}, timeout=60,
               message="the progress Service's endpoints")  # fmt: skip

    # Pods named as the run's, with tokens for the run's audience: one that nothing controls,
    # and one carrying a copy of the job's controller reference (what a namespace editor can
    # write) under a name beyond the job's replicas (the job has one master, no worker).
    job_ref = next(r for r in pod["metadata"]["ownerReferences"] if r.get("controller"))
    for forged_pod, refs in ((f"{RUN}-worker-9", []), (f"{RUN}-worker-0", [job_ref])):
        apply_objects(kube, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": forged_pod, "namespace": NS, "ownerReferences": refs},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        })  # fmt: skip
        made = get_json(kube, "pod", forged_pod, "-n", NS)["metadata"]["uid"]
        forged = token(kube, token_audience(pod), forged_pod)
        assert post(acting, ca, RUN, forged, 999)[0] == 403, forged_pod
        # Still there: the token was valid (the API server checks its pod), the pod was refused.
        assert get_json(kube, "pod", forged_pod, "-n", NS)["metadata"]["uid"] == made

    # The CA ConfigMap edited by a namespace editor: written back; deleted: made again.
    kube.kubectl("patch", "configmap", "megdet-progress-ca", "-n", NS, "--type=merge",
                 "-p", '{"data": {"ca.crt": "forged"}}')  # fmt: skip
    eventually(
        lambda: get_json(kube, "configmap", "megdet-progress-ca", "-n", NS)["data"]["ca.crt"] == ca,
        timeout=30,
        message="the CA written back",
    )
    kube.kubectl("delete", "configmap", "megdet-progress-ca", "-n", NS)
    eventually(
        lambda: (get_or_none(kube, "configmap", "megdet-progress-ca", "-n", NS) or {})
        .get("data", {})
        .get("ca.crt")
        == ca,
        timeout=30,
        message="the CA ConfigMap made again",
    )

    # The acting replica's process stops; the other goes on serving, with the same CA.
    acting.stop()
    assert post(other, ca, RUN, good, 50)[0] == 200
    eventually(lambda: iteration(kube, RUN) == 50, timeout=30, message="the other's write")
    assert get_json(kube, "configmap", "megdet-progress-ca", "-n", NS)["data"]["ca.crt"] == ca
    assert len(evaluated(kube, RUN)) == 1

    # The run created again under the same name: the old run's token is refused, and so is a
    # token for the old audience bound to the new run's pod; the new pod's own token works.
    old_audience = token_audience(pod)
    kube.kubectl("delete", "mdr", RUN, "-n", NS, "--wait=true", "--timeout=60s")
    apply_objects(kube, mdr(RUN, ns, {"gpus": 8}))
    uid = get_json(kube, "mdr", RUN, "-n", NS)["metadata"]["uid"]
    new_pod = run_pod(kube, RUN, uid)
    assert token_audience(new_pod) != old_audience
    assert post(other, ca, RUN, good, 40)[0] == 403
    stale = token(kube, old_audience, new_pod["metadata"]["name"])
    assert post(other, ca, RUN, stale, 40)[0] == 403
    fresh = token(kube, token_audience(new_pod), new_pod["metadata"]["name"])
    assert eventually(lambda: post(other, ca, RUN, fresh, 50)[0] == 200, timeout=60,
                      message="the new run's pod accepted")  # fmt: skip

    # Nothing either replica asked for was refused by the chart's RBAC.
    denied = [
        (e["verb"], e.get("objectRef"), e["responseStatus"].get("code"))
        for e in kube.audit_events(CONTROLLER_USER)
        if e.get("stage") == "ResponseComplete" and e["responseStatus"].get("code") == 403
    ]
    assert denied == []
