"""`kubectl apply` of MegDetRuns against the real API server: the CRD's defaults are applied,
invalid specs are refused by the server's own schema and CEL with the messages the docs
promise, immutable fields cannot change, and `megdet validate` agrees with the server."""

from __future__ import annotations

import copy
import functools
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from e2e_helpers import ROOT, apply_objects, get_json, mdr, namespace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megdet.api.validation import validate_run
from megdet.policy import Policy
from megdet.policy import check as check_policy
from tests.spec_strategies import GANG, KUEUE, NCCL, RUN_POLICY

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
VALUES = yaml.safe_load((ROOT / "charts/megdet/values.yaml").read_text())
NS = "apply-e2e"


@pytest.fixture(scope="module")
def ns(kube, operator_chart):
    return namespace(kube, NS)


@functools.cache
def _admin_tls(pki: Path) -> ssl.SSLContext:
    """The admin kubeconfig's TLS: the cluster's CA, the admin's client certificate."""
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    return context


def server_verdict(kube, obj: dict) -> tuple[bool, str]:
    """Server-side dry run: the API server's schema, defaults, CEL and admission policy,
    nothing stored. The request `kubectl create --dry-run=server` sends (``dryRun=All``, strict
    field validation, as the admin), made here directly: one HTTPS request per example, where
    a kubectl process each took about 0.4 s (300 examples, 133 s of the cluster's worker)."""
    group_version, meta = obj["apiVersion"], obj["metadata"]
    query = "dryRun=All&fieldValidation=Strict&fieldManager=kubectl-create"
    url = f"{kube.server}/apis/{group_version}/namespaces/{meta['namespace']}/megdetruns?{query}"
    request = urllib.request.Request(
        url, data=json.dumps(obj).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, context=_admin_tls(kube.pki), timeout=60) as answer:
            return True, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return False, refused.read().decode()


def test_examples_apply_with_the_crd_defaults(kube, ns) -> None:
    for path in EXAMPLES:
        kube.kubectl("apply", "-n", ns, "--dry-run=server", "-f", str(path))
    kube.kubectl("apply", "-n", ns, "-f", str(ROOT / "examples/megdetrun-8gpu.yaml"))
    run = get_json(kube, "mdr", "-n", ns, "r50-fpn-8gpu")
    spec = run["spec"]
    # Fields the example leaves out come back with values.yaml's defaults, nested ones too.
    assert spec["gpusPerNode"] == VALUES["gpusPerNode"]
    assert spec["baseLr"] == VALUES["baseLr"]
    assert spec["syncBN"] == VALUES["syncBN"]
    assert spec["image"]["repository"] == VALUES["image"]["repository"]
    assert spec["nccl"]["ib"]["enabled"] == VALUES["nccl"]["ib"]["enabled"]
    assert spec["resources"]["qos"] == VALUES["resources"]["qos"]
    assert spec["dataset"]["claimName"] == "coco"  # what the example set stays
    kube.kubectl("delete", "mdr", "-n", ns, "r50-fpn-8gpu", "--wait=false")


# (spec change, name, the message the server must give)
REFUSED = [
    ({"gpus": 12}, "r", "gpus above gpusPerNode must be a multiple of gpusPerNode"),
    ({"steps": [30000, 20000]}, "r", "steps must be strictly increasing"),
    ({"warmupIters": 90000}, "r", "warmupIters must be below maxIter"),
    ({"syncBN": "partial"}, "r", 'spec.syncBN: Unsupported value: "partial"'),
    ({"gpus": 0}, "r", "spec.gpus: Invalid value: 0"),
    ({"extraOverrides": {"SOLVER.BASE_LR": 1}}, "r", "SOLVER.BASE_LR is set by the value baseLr"),
    ({"extraOverrides": {"test.period": 1}}, "r", "keys must be detectron2 config keys"),
    (
        {"nccl": {"ib": {"enabled": True, "rdmaResourceName": ""}}},
        "r",
        "nccl.ib.enabled needs nccl.ib.rdmaResourceName",
    ),
    ({"kueue": {"queueName": "q"}, "runPolicy": {"suspend": True}}, "r", "Kueue owns suspend"),
    (
        {"elastic": {"minGpus": 16, "maxGpus": 32}},
        "r",
        "gpus must be within elastic.minGpus..elastic.maxGpus",
    ),
    ({}, "1run", "metadata.name must start with a letter"),
    ({}, "x" * 51, "metadata.name must be at most 50 characters"),
    ({"bogus": 1}, "r", 'unknown field "spec.bogus"'),
    # Chart values that are the platform's, not a run author's (controller/crd.py DROPPED_VALUES).
    (
        {"containerSecurityContext": {"privileged": True}},
        "r",
        'unknown field "spec.containerSecurityContext"',
    ),
    ({"allowUnsafeWeights": True}, "r", 'unknown field "spec.allowUnsafeWeights"'),
]


@pytest.mark.parametrize(("change", "name", "message"), REFUSED)
def test_invalid_specs_are_refused_by_the_server(kube, ns, change, name, message) -> None:
    spec = {"gpus": 8, "dataset": {"claimName": "coco"}, "output": {"claimName": "out"}}
    spec.update(change)
    proc = kube.kubectl(
        "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(mdr(name, ns, spec)), check=False
    )
    assert proc.returncode != 0, proc.stdout
    assert message in proc.stderr, proc.stderr


def test_immutable_fields_cannot_be_patched(kube, ns) -> None:
    spec = {"gpus": 8, "dataset": {"claimName": "coco"}, "output": {"claimName": "out"}}
    apply_objects(kube, mdr("frozen", ns, spec))

    def patch_spec(spec: dict, check: bool = True):
        body = json.dumps({"spec": spec})
        patch = ("patch", "mdr", "frozen", "-n", ns, "--type=merge", "-p", body)
        return kube.kubectl(*patch, check=check)

    try:
        for patch, message in (
            ({"gpus": 16}, "gpus is immutable"),
            ({"syncBN": "none"}, "syncBN is immutable"),
            ({"output": {"claimName": "elsewhere"}}, "output is immutable"),
        ):
            proc = patch_spec(patch, check=False)
            assert proc.returncode != 0 and message in proc.stderr, (patch, proc.stderr)
        # What stays changeable does change.
        patch_spec({"runPolicy": {"suspend": True}})
        assert get_json(kube, "mdr", "frozen", "-n", ns)["spec"]["runPolicy"]["suspend"] is True
    finally:
        kube.kubectl("delete", "mdr", "frozen", "-n", ns, "--wait=false")


def test_an_elastic_runs_gpus_change_only_within_its_bounds(kube, ns) -> None:
    spec = {
        "gpus": 8,
        "elastic": {"minGpus": 8, "maxGpus": 16},
        "dataset": {"claimName": "coco"},
        "output": {"claimName": "out"},
    }
    apply_objects(kube, mdr("stretchy", ns, spec))

    def patched(change: dict) -> tuple[int, str]:
        proc = kube.kubectl(
            "patch",
            "mdr",
            "stretchy",
            "-n",
            ns,
            "--type=merge",
            "-p",
            json.dumps({"spec": change}),
            check=False,
        )
        return proc.returncode, proc.stderr

    try:
        assert patched({"gpus": 16}) == (0, "")
        assert get_json(kube, "mdr", "stretchy", "-n", ns)["spec"]["gpus"] == 16
        code, stderr = patched({"gpus": 24})
        assert code != 0 and "spec.gpus" in stderr, stderr
        assert "gpus must be within elastic.minGpus..elastic.maxGpus" in stderr, stderr
        code, stderr = patched({"elastic": {"maxGpus": 64}})
        assert code != 0 and "elastic is immutable" in stderr, stderr
        # The other plan fields stay fixed with their own message.
        code, stderr = patched({"imagesPerGpu": 4})
        assert code != 0 and "imagesPerGpu is immutable" in stderr, stderr
    finally:
        kube.kubectl("delete", "mdr", "stretchy", "-n", ns, "--wait=false")


# -- megdet validate and the server agree ---------------------------------------------------------

specs = st.fixed_dictionaries(
    {"dataset": st.just({"claimName": "coco"}), "output": st.just({"claimName": "out"})},
    optional={
        "gpus": st.sampled_from([0, 1, 4, 8, 12, 16, 64, 128, 4096]),
        "gpusPerNode": st.sampled_from([1, 4, 8]),
        "imagesPerGpu": st.integers(1, 4),
        "accumulationSteps": st.integers(1, 4),
        "maxIter": st.sampled_from([1, 10, 1000, 90000]),
        "steps": st.lists(st.sampled_from([0, 5, 500, 60000, 80000]), max_size=3),
        "warmupIters": st.sampled_from([0, 5, 1000]),
        "syncBN": st.sampled_from(["backbone", "all", "none", "partial"]),
        "schedule": st.sampled_from(["step", "three-stage", "cosine"]),
        "scaling": st.sampled_from(["linear", "sqrt", "none"]),
        "baseLr": st.sampled_from([0.02, 0.0, -1.0, 0.5]),
        "target": st.sampled_from(["pytorchjob", "trainjob"]),
        "nccl": NCCL,
        "gang": GANG,
        "kueue": KUEUE,
        "runPolicy": RUN_POLICY,
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "qos": st.sampled_from(["Guaranteed", "Burstable"]),
                "cpu": st.sampled_from(["32", "1.5", "500m"]),
                "memoryLimit": st.sampled_from(["", "300Gi"]),
            },
        ),
        "extraOverrides": st.dictionaries(
            st.sampled_from(["TEST.EVAL_PERIOD", "SOLVER.BASE_LR", "lower.case", "SEED"]),
            st.one_of(st.integers(0, 10), st.sampled_from(["0.05", "True", "x"])),
            max_size=2,
        ),
    },
)
#: The server's verdicts seen by the agreement test (accepted: True).
VERDICTS: list[bool] = []
names = st.sampled_from(["r", "run-a", "9lives", "a.b", "x" * 40, "x" * 50, "x" * 51])


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(spec=specs, name=names)
def test_megdet_validate_agrees_with_the_server(kube, ns, spec, name) -> None:
    obj = mdr(name, ns, copy.deepcopy(spec))
    accepted, detail = server_verdict(kube, obj)
    # The server applies the CRD's schema and CEL, then the cluster's policy (the operator
    # chart's defaults: its admission policy); `megdet validate` and the controller, the same.
    problems = [*validate_run(spec, name=name), *check_policy(spec, Policy())]
    VERDICTS.append(accepted)
    assert accepted == (not problems), (spec, name, detail, problems)


def test_the_agreement_covered_both_verdicts() -> None:
    """The comparison above saw many accepted and many refused specs (runs after it)."""
    assert VERDICTS.count(True) >= 30 and VERDICTS.count(False) >= 30, (
        VERDICTS.count(True),
        VERDICTS.count(False),
    )


def test_the_crd_file_is_what_the_server_serves(kube, operator_chart) -> None:
    served = get_json(kube, "crd", "megdetruns.megdet.io")
    committed = yaml.safe_load(
        Path(ROOT / "charts/megdet-operator/crds/megdetruns.megdet.io.yaml").read_text()
    )
    assert served["spec"]["names"] == {
        **committed["spec"]["names"],
        **{"listKind": "MegDetRunList"},
    }
