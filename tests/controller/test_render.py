"""One job shape: what the controller creates is what `helm install` of the run chart renders.

The "helm install" side is the chart tests' own path (tests/chart/chart_helpers: values files
merged like `helm -f`, the real Helm engine). The controller side is render_run on a MegDetRun
spec defaulted by the CRD, as the API server hands it over. Apart from names and labels (and the
owner reference the operator adds) the objects must be equal.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import helm_python
import pytest
from chart_helpers import CHART_DIR, CI_VALUES, values_file
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from megdet.api.validation import (
    crd_problems,
    crd_spec_schema,
    default_spec,
    plan_problems,
)
from megdet.controller.api import DROPPED_VALUES
from megdet.controller.problems import InvalidRunError, Problem
from megdet.controller.render import (
    CHART_DIR_ENV,
    MANAGED_BY,
    ChartRenderer,
    chart_dir,
    render_run,
)
from megdet.plan import plan_run

REPO = Path(__file__).resolve().parents[2]

JOB_KINDS = ("PyTorchJob", "TrainJob")


@pytest.fixture(scope="module")
def chart():
    with helm_python.Chart.load(str(CHART_DIR)) as loaded:
        yield loaded


def helm_install(chart, release: str, namespace: str, values: Mapping[str, Any]) -> list[dict]:
    """`helm install RELEASE charts/megdet -n NAMESPACE -f values`: the objects, job first."""
    import yaml

    files = chart.render(values=dict(values), name=release, namespace=namespace, is_install=True)
    objects = [
        doc
        for path, text in sorted(files.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return sorted(objects, key=lambda o: o["kind"] not in JOB_KINDS)


def without_names(obj: Any, fullname: str) -> Any:
    """``obj`` with object names, namespaces and labels removed and its fullname replaced."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if key == "labels":
                continue
            if key == "metadata" and isinstance(value, dict):
                value = {k: v for k, v in value.items() if k not in ("name", "namespace")}
            out[key] = without_names(value, fullname)
        return out
    if isinstance(obj, list):
        return [without_names(v, fullname) for v in obj]
    if isinstance(obj, str):
        return obj.replace(fullname, "<fullname>")
    return obj


def managed_by_helm(objects: list[dict]) -> list[dict]:
    """The controller's objects as Helm labels them: the one label the controller rewrites."""
    out = copy.deepcopy(objects)
    for obj in out:
        labels = obj["metadata"].get("labels", {})
        if labels.get("app.kubernetes.io/managed-by") == MANAGED_BY:
            labels["app.kubernetes.io/managed-by"] = "Helm"
    return out


def cr_spec(values: Mapping[str, Any]) -> dict[str, Any]:
    """A values file as a MegDetRun spec: the same names, minus the chart's naming values."""
    return {k: copy.deepcopy(v) for k, v in values.items() if k not in DROPPED_VALUES}


@pytest.mark.parametrize("path", CI_VALUES, ids=lambda p: p.name)
def test_controller_job_equals_helm_install_for_ci_values(chart, path):
    values = values_file(path)
    # Same release name and namespace as the chart tests: then even names must be equal.
    helm = helm_install(chart, "megdet", "vision", values)
    run = render_run("megdet", "vision", default_spec(cr_spec(values)))
    # Equal to the letter, apart from who manages the objects.
    assert managed_by_helm(list(run.objects)) == helm
    assert run.job["metadata"]["labels"]["app.kubernetes.io/managed-by"] == MANAGED_BY
    assert all(
        o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == MANAGED_BY
        for o in run.objects
        if "app.kubernetes.io/managed-by" in o["metadata"].get("labels", {})
    )


@pytest.mark.parametrize("path", CI_VALUES, ids=lambda p: p.name)
def test_controller_job_equals_helm_install_apart_from_names(chart, path):
    values = values_file(path)
    # `helm install r50-coco charts/megdet` names things r50-coco-megdet; the controller
    # names them after the run.
    helm = helm_install(chart, "r50-coco", "team-a", values)
    run = render_run("r50-coco", "team-a", default_spec(cr_spec(values)))
    assert helm[0]["metadata"]["name"] == "r50-coco-megdet"
    assert run.job["metadata"]["name"] == "r50-coco"
    assert without_names(list(run.objects), "r50-coco") == without_names(helm, "r50-coco-megdet")


def test_sparse_spec_with_crd_defaults_renders_like_chart_defaults(chart):
    """CRD defaults == chart defaults: a two-field CR and a two-value install agree."""
    sparse = {"gpus": 16, "dataset": {"claimName": "coco"}}
    defaulted = default_spec(sparse)
    assert len(defaulted) > 30  # the CRD really filled in the rest
    helm = helm_install(chart, "megdet", "vision", sparse)
    assert managed_by_helm(list(render_run("megdet", "vision", defaulted).objects)) == helm
    assert managed_by_helm(list(render_run("megdet", "vision", sparse).objects)) == helm


# -- a hypothesis matrix of valid runs ----------------------------------------------------------

_gpus = st.sampled_from([1, 2, 4, 8, 16, 24, 64, 128])
matrix_specs = st.fixed_dictionaries(
    {"gpus": _gpus},
    optional={
        "gpusPerNode": st.sampled_from([1, 2, 4, 8]),
        "imagesPerGpu": st.integers(1, 4),
        "accumulationSteps": st.integers(1, 4),
        "baseLr": st.floats(0.001, 0.1),
        "referenceBatch": st.sampled_from([8, 16, 32]),
        "scaling": st.sampled_from(["linear", "sqrt", "none"]),
        "schedule": st.sampled_from(["step", "three-stage"]),
        "maxIter": st.integers(2000, 200_000),
        "syncBN": st.sampled_from(["backbone", "all", "none"]),
        "bnGroupSize": st.sampled_from([0, 8, 16]),
        "numWorkers": st.one_of(st.none(), st.integers(0, 8)),
        "target": st.sampled_from(["pytorchjob", "trainjob"]),
        "nccl": st.fixed_dictionaries(
            {},
            optional={
                "ib": st.fixed_dictionaries(
                    {"enabled": st.booleans(), "rdmaResourceName": st.just("rdma/ib")},
                    optional={"gidIndex": st.integers(0, 3), "hca": st.just("mlx5")},
                ),
                "debug": st.sampled_from(["", "INFO"]),
            },
        ),
        "gang": st.fixed_dictionaries(
            {"enabled": st.booleans()}, optional={"queue": st.sampled_from(["", "training"])}
        ),
        "network": st.fixed_dictionaries({}, optional={"hostNetwork": st.booleans()}),
        "runPolicy": st.fixed_dictionaries({}, optional={"suspend": st.booleans()}),
        "extraOverrides": st.dictionaries(
            st.sampled_from(["TEST.EVAL_PERIOD", "SOLVER.CHECKPOINT_PERIOD", "MEGDET.AMP"]),
            st.one_of(st.integers(100, 5000), st.booleans()),
            max_size=2,
        ),
        "priorityClassName": st.sampled_from(["", "high"]),
    },
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=matrix_specs, release=st.sampled_from(["run-a", "megdet"]))
def test_controller_job_equals_helm_install_over_a_matrix(chart, spec, release):
    defaulted = default_spec(spec)
    assume(not crd_problems(defaulted) and not plan_problems(defaulted))
    helm = helm_install(chart, release, "vision", spec)
    run = render_run(release, "vision", defaulted)
    fullname = release if "megdet" in release else f"{release}-megdet"
    assert without_names(list(run.objects), release) == without_names(helm, fullname)
    assert run.job["kind"] == ("TrainJob" if spec.get("target") == "trainjob" else "PyTorchJob")


# -- what render_run returns --------------------------------------------------------------------


def test_status_plan_is_plan_run():
    spec = {"gpus": 32, "imagesPerGpu": 4, "scaling": "sqrt", "maxIter": 90000}
    status = render_run("r", "ns", spec).status_plan()
    plan = plan_run({"gpus": 32, "images_per_gpu": 4, "scaling": "sqrt", "max_iter": 90000})
    # 32 GPUs x 4 images on 8-GPU nodes; the reference recipe (16 images, LR 0.02, steps
    # 60000/80000, warm-up 1000) rescaled by 128 / 16 = 8, its LR by sqrt(8).
    by_hand = {"worldSize": 32, "nodes": 4, "globalBatch": 128, "maxIter": 11250,
               "steps": [7500, 10000], "warmupIters": 125}  # fmt: skip
    assert status == {**by_hand, "lr": plan.lr}
    assert plan.lr == pytest.approx(0.02 * 8**0.5)
    assert (plan.world_size, plan.nodes, plan.global_batch, plan.max_iter) == (32, 4, 128, 11250)
    assert (list(plan.steps), plan.warmup_iters) == ([7500, 10000], 125)


def test_trainjob_target_puts_the_job_first():
    kinds = [o["kind"] for o in render_run("r", "ns", {"target": "trainjob"}).objects]
    assert kinds[0] == "TrainJob" and "TrainingRuntime" in kinds


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # A chart `fail`: the message names the value first ("gpus=12 ...").
        (
            {"gpus": 12},
            [
                Problem(
                    "spec.gpus",
                    "gpus=12 is not a multiple of gpusPerNode=8 (multi-node runs use whole nodes)",
                )
            ],
        ),
        # values.schema.json errors, one per line of Helm's message.
        ({"gpus": "x"}, [Problem("spec.gpus", "got string, want integer")]),
        ({"bogus": 1}, [Problem("spec.bogus", "unknown field")]),
        (
            {"nccl": {"ib": {"enabled": "on"}}},
            [Problem("spec.nccl.ib.enabled", "got string, want boolean")],
        ),
    ],
)
def test_render_errors_name_the_field(spec, expected):
    with pytest.raises(InvalidRunError) as excinfo:
        render_run("r", "ns", spec)
    assert excinfo.value.problems == expected


def test_concurrent_renders_keep_their_own_names():
    renderer = ChartRenderer()
    names: dict[str, str] = {}

    def render(name: str) -> None:
        names[name] = renderer.render(name, "ns", {"gpus": 8}).job["metadata"]["name"]

    threads = [threading.Thread(target=render, args=(f"run-{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert names == {f"run-{i}": f"run-{i}" for i in range(6)}


def test_chart_dir_comes_from_the_environment(monkeypatch, tmp_path):
    import shutil

    import yaml

    assert chart_dir() == REPO / "charts" / "megdet"
    copy_dir = tmp_path / "megdet"
    shutil.copytree(CHART_DIR, copy_dir)
    values = yaml.safe_load((copy_dir / "values.yaml").read_text())
    values["image"]["repository"] = "registry.example.com/megdet"
    (copy_dir / "values.yaml").write_text(yaml.safe_dump(values))
    monkeypatch.setenv(CHART_DIR_ENV, str(copy_dir))
    assert chart_dir() == copy_dir
    job = ChartRenderer().render("r", "ns", {"gpus": 8}).job
    image = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert image["image"].startswith("registry.example.com/megdet:")


def test_the_controller_renders_a_run_once_and_creates_that_render(monkeypatch):
    from megdet.controller import planning

    renderer = ChartRenderer()

    class CountingChart:
        def __init__(self, chart: Any) -> None:
            self.chart, self.renders = chart, 0

        def render(self, **kwargs: Any) -> Any:
            self.renders += 1
            return self.chart.render(**kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.chart, name)

    # Both the chart and its copy without the values schema (values the in-process schema
    # passes are rendered by the copy): one render in all.
    checked, unchecked = CountingChart(renderer._chart), CountingChart(renderer._unchecked)
    renderer._chart, renderer._unchecked = checked, unchecked

    class Both:
        @property
        def renders(self) -> int:
            return checked.renders + unchecked.renders

    counting = Both()
    monkeypatch.setattr(planning, "render_run", renderer.render)
    run = {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {"name": "r", "namespace": "ns", "uid": "u-1"},
        "spec": {"gpus": 16},
    }
    planned = planning.plan_children(run)
    assert isinstance(planned, planning.Planned)
    assert counting.renders == 1
    # A valid spec: the values schema was checked in process, the copy without it rendered.
    assert unchecked.renders == 1 and renderer.prechecked == 1
    # What is created is that render, adopted: no second render, no cached copy.
    assert planned.objects[0] is planned.rendered.objects[0]
    assert planned.job["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    # The same inputs reuse the kept render (controller/render.py's memo), as a copy: nothing
    # a caller changes leaks into the next call's objects.
    planned.job["metadata"].setdefault("labels", {})["leak"] = "x"
    again = planning.plan_children(run)
    assert counting.renders == 1 and again.job is not planned.job
    assert "leak" not in (again.job["metadata"].get("labels") or {})


# -- strings with YAML syntax in them -----------------------------------------------------------

_YAML_SYNTAX = ["a: b", "x #c", "\x1f", "'q", "- z", "{a}", "a\nb", "*ref", "!!str"]


def _free_strings(node: Mapping[str, Any], path: tuple[str, ...] = ()):
    """Paths of the spec's string fields that are not enums."""
    if node.get("type") == "string" and "enum" not in node:
        yield path
    for name, prop in (node.get("properties") or {}).items():
        yield from _free_strings(prop, (*path, name))


def _with(path: tuple[str, ...], value: str) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    node = spec
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    # Switch on the part of the chart that uses the value.
    if path[0] == "gang":
        spec["gang"]["enabled"] = True
    if path[:2] == ("nccl", "ib"):
        spec["nccl"]["ib"] = {"enabled": True, "rdmaResourceName": "rdma/ib", **spec["nccl"]["ib"]}
    return spec


def test_a_string_value_is_refused_or_rendered_verbatim():
    """No string value can change the shape of the rendered YAML: the values schema refuses
    it (at `kubectl apply` already), or it reaches the objects unchanged."""
    import json

    schema = crd_spec_schema()
    checked = 0
    for path in _free_strings(schema):
        for value in _YAML_SYNTAX:
            spec = default_spec(_with(path, value))
            if crd_problems(spec):
                continue
            try:
                objects = render_run("r", "ns", spec).objects
            except InvalidRunError as err:
                # The chart's own checks may refuse it, naming a field; never a YAML error.
                assert all("does not parse" not in p.message for p in err.problems), err
                continue
            checked += 1
            assert json.dumps(value)[1:-1] in json.dumps(objects), (path, value)
    assert checked > 50
