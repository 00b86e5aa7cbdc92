"""Every string value reaches the rendered objects as the same string, whatever it looks like.

An unquoted template value is re-typed by whoever reads the YAML: `claimName: 123` is an
integer, `priorityClassName: null` is null, `serviceAccountName: on` is true in YAML 1.1, and
`image: 1:30` is 90 (YAML 1.1's base-60 integers). PyYAML, which the controller and these tests
read the chart's output with, is a YAML 1.1 reader, and it also refuses a plain `=` (YAML 1.1's
value type) and `<<` (a merge key). The chart quotes every string it writes; this module walks
values.schema.json for every string-typed value, sets it to such strings (those its schema
allows: patterns and lengths are respected, and pattern-only fields get strings generated from
the pattern), renders both targets and finds each one, unchanged and still a string, at its
place in the rendered objects.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml
from chart_helpers import CHART_DIR, NAMESPACE, RELEASE
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from megdet.controller.render import split_manifests
from megdet.run_values import RUN_VALUES, pod_name

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())

# Strings that a YAML 1.1 reader takes for something else when they are written plain:
# booleans, null, hex/octal/exponent/base-60 numbers, infinities, and YAML syntax.
YAML_LOOKALIKES = [
    "yes", "no", "on", "off", "y", "n", "true", "false", "null", "~",
    "Yes", "NO", "On", "OFF", "True", "FALSE", "Null", "NULL", "Y", "N", "ON", "YES", "TRUE",
    "0x1f", "1e3", "1E3", "012", "0o17", "0b101", "1_000", "1:30", "-1:30", "190:20:30",
    ".inf", "-.inf", ".NaN", ".5", "-.5", "+1", "1", "30", "123", "0", "1.0", "2001-12-14",
    "=", "<<", "- x", "a: b", "#c", "'q", '"q', "%x", "@x", "`x", "!x", "!!str x", "*a", "&a",
    "|", ">", "?", "{x}", "[x]", ",", "x #c", " lead", "trail ",
]  # fmt: skip


def _types(node: Mapping[str, Any]) -> list[str]:
    kind = node.get("type")
    return [kind] if isinstance(kind, str) else list(kind or [])


def string_paths(node: Mapping[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple]:
    """Paths of every string-typed value that is not an enum: property names, "*" for a map's
    values (additionalProperties, patternProperties) and "[]" for a list's items."""
    if "string" in _types(node) and "enum" not in node:
        yield path
    for name, sub in (node.get("properties") or {}).items():
        yield from string_paths(sub, (*path, name))
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping):
        yield from string_paths(extra, (*path, "*"))
    for sub in (node.get("patternProperties") or {}).values():
        yield from string_paths(sub, (*path, "*"))
    items = node.get("items")
    if isinstance(items, Mapping):
        yield from string_paths(items, (*path, "[]"))


def leaf_schema(path: tuple[str, ...]) -> dict[str, Any]:
    node: Mapping[str, Any] = SCHEMA
    for part in path:
        if part == "[]":
            node = node["items"]
        elif part == "*":
            node = node.get("additionalProperties") or next(
                iter(node["patternProperties"].values())
            )
        else:
            node = node["properties"][part]
    return {k: v for k, v in node.items() if k in ("type", "pattern", "minLength", "maxLength")}


# --- where each value lands ---------------------------------------------------------------------


class Objects:
    """The rendered objects of one release, by role; the same accessors for both targets."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        kinds: dict[str, list[dict[str, Any]]] = {}
        for obj in objects:
            kinds.setdefault(obj["kind"], []).append(obj)
        self.trainjob = "TrainJob" in kinds
        (self.job,) = kinds["TrainJob" if self.trainjob else "PyTorchJob"]
        if self.trainjob:
            (self.runtime,) = kinds["TrainingRuntime"]
            jobs = self.runtime["spec"]["template"]["spec"]["replicatedJobs"]
            self.pods = [j["template"]["spec"]["template"] for j in jobs]
        else:
            replicas = self.job["spec"]["pytorchReplicaSpecs"].values()
            self.pods = [r["template"] for r in replicas]
        self.network_policies = kinds.get("NetworkPolicy", [])

    @property
    def specs(self) -> list[dict[str, Any]]:
        return [p["spec"] for p in self.pods]

    @property
    def containers(self) -> list[dict[str, Any]]:
        return [s["containers"][0] for s in self.specs]

    def scheduling_policies(self) -> list[dict[str, Any]]:
        """The PyTorchJob's gang schedulingPolicy, if it has one."""
        if self.trainjob:
            return []
        policy = self.job["spec"]["runPolicy"].get("schedulingPolicy")
        return [policy] if policy else []

    def envs(self) -> list[dict[str, Any]]:
        return [{e["name"]: e.get("value") for e in c["env"]} for c in self.containers]

    def args(self, flag: str) -> list[str]:
        return [c["args"][c["args"].index(flag) + 1] for c in self.containers]

    def security(self, *keys: str) -> list[Any]:
        out = []
        for c in self.containers:
            node = c["securityContext"]
            for key in keys:
                node = node[key]
            out.append(node)
        return out


def _helm_name(value: str) -> str:
    """megdet.name: nameOverride (or the chart name), cut to 63, one trailing '-' trimmed."""
    name = (value or "megdet")[:63]
    return name[:-1] if name.endswith("-") else name


# path -> (rendered objects, the value, the map key it was set under) -> [(actual, expected)].
Found = list[tuple[Any, Any]]
Place = Callable[[Objects, str, str], Found]


def _volume(index: int, *keys: str) -> Place:
    def found(o: Objects, v: str, k: str) -> Found:
        out = []
        for spec in o.specs:
            node = spec["volumes"][index]
            for key in keys:
                node = node[key]
            out.append((node, v))
        return out

    return found


def _security(*keys: str) -> Place:
    return lambda o, v, k: [(x, v) for x in o.security(*keys)]


def _security_list(*keys: str) -> Place:
    return lambda o, v, k: [(x, v) for items in o.security(*keys) for x in items]


def _env(name: str) -> Place:
    return lambda o, v, k: [(env[name], v) for env in o.envs()]


def _flag(flag: str, prefix: str = "") -> Place:
    return lambda o, v, k: [(a, prefix + v) for a in o.args(flag)]


def _resource(kind: str, name: str | None = None) -> Place:
    """A container resource: the quantity under `name`, or (name None) the value as a key."""
    if name is None:
        return lambda o, v, k: [
            (key, v) for c in o.containers for key in c["resources"][kind] if key == v
        ]
    return lambda o, v, k: [(c["resources"][kind][name], v) for c in o.containers]


def _pod_field(name: str) -> Place:
    return lambda o, v, k: [(s[name], v) for s in o.specs]


def _queue(o: Objects, v: str, k: str) -> Found:
    if o.trainjob:
        annotations = o.runtime["spec"]["template"]["metadata"]["annotations"]
        return [(annotations["scheduling.volcano.sh/queue-name"], v)]
    return [(policy["queue"], v) for policy in o.scheduling_policies()]


def _metrics_from(o: Objects, v: str, k: str) -> Found:
    (policy,) = o.network_policies
    peers = policy["spec"]["ingress"][1]["from"]
    return [(peers[0]["namespaceSelector"]["matchLabels"][k], v)]


def _progress_url(o: Objects, v: str, k: str) -> Found:
    """The env the trainer posts to (target pytorchjob); a TrainJob's pods get none (Trainer
    injects its own)."""
    if o.trainjob:
        return [(str(any("KUBEFLOW_TRAINER_SERVER_URL" in env for env in o.envs())), "False")]
    base = v.removesuffix("/")
    return [(env["KUBEFLOW_TRAINER_SERVER_URL"][: len(base)], base) for env in o.envs()]


def _progress_uid(o: Objects, v: str, k: str) -> Found:
    """The end of the token audience (target pytorchjob; a TrainJob's pods get none)."""
    if o.trainjob:
        volumes = [vol.get("name") for spec in o.specs for vol in spec.get("volumes") or []]
        return [(str("megdet-progress" in volumes), "False")]
    return [
        (source["serviceAccountToken"]["audience"].rsplit("/", 1)[1], v)
        for spec in o.specs
        for vol in spec["volumes"]
        if "projected" in vol
        for source in vol["projected"]["sources"]
        if "serviceAccountToken" in source
    ]


def _progress_ca(o: Objects, v: str, k: str) -> Found:
    if o.trainjob:
        volumes = [vol.get("name") for spec in o.specs for vol in spec.get("volumes") or []]
        return [(str("megdet-progress" in volumes), "False")]
    return [
        (source["configMap"]["name"], v)
        for spec in o.specs
        for vol in spec["volumes"]
        if "projected" in vol
        for source in vol["projected"]["sources"]
        if "configMap" in source
    ]


def _run_value_places() -> dict[tuple[str, ...], Place]:
    """The free string run values the trainer gets (megdet/run_values.py): a key or flag's
    word, an env variable's value."""
    strings = set(string_paths(SCHEMA))
    places: dict[tuple[str, ...], Place] = {}
    for row in RUN_VALUES:
        path = tuple(row.value.split("."))
        if path in strings and row.kind in ("key", "flag"):
            places[path] = _flag(pod_name(row), row.prefix)
        elif path in strings and row.kind == "env":
            places[path] = _env(row.to)
    return places


PLACES: dict[tuple[str, ...], Place] = {
    **_run_value_places(),
    ("nameOverride",): lambda o, v, k: [
        (labels["app.kubernetes.io/name"], _helm_name(v))
        for labels in [o.job["metadata"]["labels"], *(p["metadata"]["labels"] for p in o.pods)]
    ],
    ("fullnameOverride",): lambda o, v, k: [
        (o.job["metadata"]["name"], v),
        *_env("MEGDET_RUN_ID")(o, v, k),
    ],
    ("runName",): _flag("--output", "/output/"),
    ("resumeFrom",): _flag("MEGDET.RESUME_FROM"),
    ("image", "repository"): lambda o, v, k: [
        (c["image"].rsplit(":", 1)[0], v) for c in o.containers
    ],
    ("image", "tag"): lambda o, v, k: [(c["image"].rsplit(":", 1)[1], v) for c in o.containers],
    ("imagePullSecrets", "[]", "name"): lambda o, v, k: [
        (s["imagePullSecrets"][0]["name"], v) for s in o.specs
    ],
    ("config",): _flag("--config"),
    ("extraOverrides", "*"): lambda o, v, k: [
        (c["args"][c["args"].index(k) + 1], v) for c in o.containers
    ],
    ("dataset", "claimName"): _volume(0, "persistentVolumeClaim", "claimName"),
    ("dataset", "trainJson"): _flag("--train-json", "/data/"),
    ("dataset", "trainImages"): _flag("--train-images", "/data/"),
    ("dataset", "valJson"): _flag("--val-json", "/data/"),
    ("dataset", "valImages"): _flag("--val-images", "/data/"),
    ("output", "claimName"): _volume(1, "persistentVolumeClaim", "claimName"),
    ("shm", "sizeLimit"): _volume(2, "emptyDir", "sizeLimit"),
    ("containerSecurityContext", "capabilities", "add", "[]"): _security_list(
        "capabilities", "add"
    ),
    ("containerSecurityContext", "capabilities", "drop", "[]"): _security_list(
        "capabilities", "drop"
    ),
    ("containerSecurityContext", "seccompProfile", "localhostProfile"): _security(
        "seccompProfile", "localhostProfile"
    ),
    ("containerSecurityContext", "appArmorProfile", "localhostProfile"): _security(
        "appArmorProfile", "localhostProfile"
    ),
    **{
        ("containerSecurityContext", "seLinuxOptions", field): _security("seLinuxOptions", field)
        for field in ("level", "role", "type", "user")
    },
    ("gpuResource",): _resource("requests"),
    ("resources", "cpu"): _resource("requests", "cpu"),
    ("resources", "memory"): _resource("requests", "memory"),
    ("resources", "memoryLimit"): _resource("limits", "memory"),
    ("nccl", "debugSubsys"): _env("NCCL_DEBUG_SUBSYS"),
    ("nccl", "socketIfname"): _env("NCCL_SOCKET_IFNAME"),
    ("nccl", "ib", "rdmaResourceName"): _resource("limits"),
    ("nccl", "ib", "hca"): _env("NCCL_IB_HCA"),
    ("network", "multusNetworks"): lambda o, v, k: [
        (p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"], v) for p in o.pods
    ],
    ("gang", "schedulerName"): _pod_field("schedulerName"),
    ("gang", "queue"): _queue,
    ("kueue", "queueName"): lambda o, v, k: [
        (o.job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], v)
    ],
    ("priorityClassName",): lambda o, v, k: [
        *_pod_field("priorityClassName")(o, v, k),
        *((policy["priorityClass"], v) for policy in o.scheduling_policies()),
    ],
    ("serviceAccountName",): _pod_field("serviceAccountName"),
    ("nodeSelector", "*"): lambda o, v, k: [(s["nodeSelector"][k], v) for s in o.specs],
    ("podAnnotations", "*"): lambda o, v, k: [(p["metadata"]["annotations"][k], v) for p in o.pods],
    ("podLabels", "*"): lambda o, v, k: [(p["metadata"]["labels"][k], v) for p in o.pods],
    ("extraEnv", "[]", "name"): lambda o, v, k: [(c["env"][-1]["name"], v) for c in o.containers],
    ("extraEnv", "[]", "value"): lambda o, v, k: [(c["env"][-1]["value"], v) for c in o.containers],
    ("networkPolicy", "metricsFrom", "[]", "*"): _metrics_from,
    ("progress", "url"): _progress_url,
    ("progress", "caConfigMap"): _progress_ca,
    ("progress", "runUID"): _progress_uid,
}

# Map keys the values above are set under (keys are checked too: "yes" as a key is true in
# YAML 1.1). extraOverrides keys must be detectron2 keys that no named value owns.
MAP_KEYS = {
    ("extraOverrides", "*"): st.sampled_from(["MODEL.WEIGHTS", "TEST.NAME"]),
}
PLAIN_KEYS = st.sampled_from(["team", "yes", "on", "null", "1:30", "012", "0x1f", "~", "true"])

# Values that are not strings but decide whether a string is rendered at all (and that the
# chart's cross-field rules need): Burstable so that any cpu quantity and a memory limit are
# allowed, InfiniBand on (hca, rdmaResourceName), a NetworkPolicy (metricsFrom), seccomp and
# AppArmor profiles of type Localhost (localhostProfile), the gang on (schedulerName, queue).
CONTEXT: dict[str, Any] = {
    "resources": {"qos": "Burstable"},
    "nccl": {"ib": {"enabled": True}},
    "networkPolicy": {"enabled": True},
    "containerSecurityContext": {
        "seccompProfile": {"type": "Localhost"},
        "appArmorProfile": {"type": "Localhost"},
    },
    "gang": {"enabled": True},
    # Progress reporting on (the controller sets all three; a drawn value replaces one of them).
    "progress": {
        "url": "https://megdet-operator.megdet-system.svc:8443",
        "caConfigMap": "ca",
        "runUID": "0b6c2d5e-1111-4a4a-9f9f-123456789abc",
    },
}
# Chart rules beyond the schema: the job name is an RFC 1035 label that fits both targets'
# name budgets; the gang queue is Volcano's only (drawn with the scheduler name below).
EXTRA_RULES: dict[tuple[str, ...], Callable[[str], bool]] = {
    ("fullnameOverride",): lambda v: bool(re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", v))
    and len(v) <= 40,
}


@functools.cache
def strings_for(path: tuple[str, ...]) -> st.SearchStrategy[str]:
    """YAML look-alikes the field's schema accepts, and strings generated from its pattern."""
    schema = leaf_schema(path)
    schema["type"] = "string"
    validator = jsonschema.Draft7Validator(schema)
    rule = EXTRA_RULES.get(path, lambda v: True)

    def ok(value: str) -> bool:
        return value != "" and rule(value) and validator.is_valid(value)

    fitting = [v for v in YAML_LOOKALIKES if ok(v)]
    options = [st.sampled_from(fitting)] if fitting else []
    if "pattern" not in schema:
        # Free text: any characters too (quote escapes what YAML readers would fold or refuse).
        options.append(st.text(min_size=1, max_size=8).filter(ok))
    elif len(fitting) < 10:
        # Few look-alikes fit (quantities): strings generated from the pattern as well. (More
        # for every pattern would cost ~0.1 s per example: hypothesis's regex strategy is slow.)
        options.append(st.from_regex(schema["pattern"], fullmatch=True).filter(ok))
    return st.one_of(options)


def set_value(values: dict[str, Any], path: tuple[str, ...], key: str, value: str) -> None:
    """Set values[path] = value, creating maps and one-item lists on the way."""
    node: Any = values
    for part, following in zip(path, [*path[1:], None], strict=True):
        last = following is None
        if part == "[]":
            if last:
                node.append(value)
                return
            if not node:
                node.append([] if following == "[]" else {})
            node = node[0]
            continue
        name = key if part == "*" else part
        if last:
            node[name] = value
            return
        node = node.setdefault(name, [] if following == "[]" else {})


#: Subtrees whose strings cannot all be set in one values file (an extraEgress destination is an
#: ipBlock alone or selectors, never both): each has its own round-trip values below, and the
#: walk's guard checks that those values set every string of the subtree.
SEPARATE = (("networkPolicy", "extraEgress"),)
ALL_STRING_PATHS = sorted(string_paths(SCHEMA))
STRING_PATHS = [p for p in ALL_STRING_PATHS if not any(p[: len(s)] == s for s in SEPARATE)]

# extraEgress with YAML 1.1 lookalikes wherever its schema lets them in (label values and
# keys, expression values); CIDRs are what their pattern allows.
EXTRA_EGRESS = [
    {"to": [{"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.5.0/24"]}}]},
    {
        "to": [
            {
                "namespaceSelector": {
                    "matchLabels": {"yes": "on"},
                    "matchExpressions": [{"key": "null", "operator": "In", "values": ["012"]}],
                },
                "podSelector": {
                    "matchLabels": {"true": "0x1f"},
                    "matchExpressions": [{"key": "no", "operator": "NotIn", "values": ["1e3"]}],
                },
            }
        ]
    },
]


def _set_paths(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The string paths (as string_paths names them) that ``value`` sets."""
    if isinstance(value, str):
        yield path
    elif isinstance(value, list):
        for item in value:
            yield from _set_paths(item, (*path, "[]"))
    elif isinstance(value, dict):
        map_like = path and path[-1] == "matchLabels"
        for key, item in value.items():
            yield from _set_paths(item, (*path, "*" if map_like else key))


@st.composite
def string_values(draw) -> tuple[dict[str, Any], dict[tuple[str, ...], tuple[str, str]]]:
    """Values with every string field set (one draw per field), and what was set where."""
    values: dict[str, Any] = json.loads(json.dumps(CONTEXT))
    chosen: dict[tuple[str, ...], tuple[str, str]] = {}
    volcano = draw(st.booleans())
    for path in STRING_PATHS:
        if path == ("gang", "queue") and not volcano:
            continue  # refused unless the scheduler is Volcano
        key = draw(MAP_KEYS.get(path, PLAIN_KEYS)) if "*" in path else ""
        value = draw(strings_for(path))
        if path == ("gang", "schedulerName"):
            value = "volcano" if volcano else value
            assume(value != "volcano" or volcano)
        chosen[path] = (key, value)
        set_value(values, path, key, value)
    # The RDMA resource is a second extended resource: it must not be the GPU's.
    assume(values["nccl"]["ib"]["rdmaResourceName"] != values["gpuResource"])
    return values, chosen


def _keys_are_strings(value: Any, where: str = "") -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            assert isinstance(k, str), f"{where}: key {k!r} is a {type(k).__name__}"
            _keys_are_strings(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _keys_are_strings(v, f"{where}[{i}]")


def assert_each_value_is_in_place(objects: list[dict], chosen) -> None:
    rendered = Objects(objects)
    for obj in objects:
        _keys_are_strings(obj, obj["kind"])
    for path, (key, value) in chosen.items():
        found = PLACES[path](rendered, value, key)
        assert found, f"{'.'.join(path)}={value!r}: not rendered"
        for actual, expected in found:
            assert isinstance(actual, str), f"{'.'.join(path)}={value!r} came back as {actual!r}"
            assert actual == expected, f"{'.'.join(path)}={value!r} came back as {actual!r}"


def test_every_string_field_of_the_schema_has_a_place():
    # Guards the walk: a new string value must say where it lands, or this fails.
    assert set(STRING_PATHS) == set(PLACES)
    assert len(STRING_PATHS) >= 40
    # ...and every string of a separately checked subtree is set by its own values.
    separate = {p for p in ALL_STRING_PATHS if p not in STRING_PATHS}
    assert separate <= set(_set_paths(EXTRA_EGRESS, ("networkPolicy", "extraEgress")))


@pytest.mark.parametrize("target", ["pytorchjob", "trainjob"])
def test_extra_egress_strings_come_back_unchanged(render, target):
    policy_values = {"enabled": True, "restrictEgress": True, "extraEgress": EXTRA_EGRESS}
    values = {"target": target, "networkPolicy": policy_values}
    (policy,) = [o for o in render(values).objects if o["kind"] == "NetworkPolicy"]
    assert policy["spec"]["egress"][-len(EXTRA_EGRESS) :] == EXTRA_EGRESS
    _keys_are_strings(policy, "NetworkPolicy")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(drawn=string_values(), target=st.sampled_from(["pytorchjob", "trainjob"]))
def test_string_values_come_back_unchanged_for_both_targets(render, drawn, target):
    values, chosen = drawn
    values["target"] = target
    assert_each_value_is_in_place(render(values).objects, chosen)


@pytest.mark.parametrize("target", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize(
    ("values", "path", "expected"),
    [
        ({"dataset": {"claimName": "123"}}, ("dataset", "claimName"), "123"),
        ({"priorityClassName": "null"}, ("priorityClassName",), "null"),
        ({"serviceAccountName": "on"}, ("serviceAccountName",), "on"),
        ({"image": {"repository": "1", "tag": "30"}}, None, "1:30"),
        ({"extraEnv": [{"name": "X", "value": "="}]}, ("extraEnv", "[]", "value"), "="),
        ({"podLabels": {"yes": "no"}}, ("podLabels", "*"), "no"),
    ],
    ids=[
        "claimName-123",
        "priorityClassName-null",
        "serviceAccountName-on",
        "image-1-30",
        "env-value-equals",
        "label-yes-no",
    ],
)
def test_the_reported_retypings_are_gone(render, target, values, path, expected):
    objects = Objects(render({**values, "target": target}).objects)
    if path is None:
        assert [c["image"] for c in objects.containers] == [expected] * len(objects.containers)
        return
    key = next(iter(values["podLabels"])) if path[0] == "podLabels" else ""
    for actual, want in PLACES[path](objects, expected, key):
        assert actual == want and isinstance(actual, str)


def test_lookalikes_are_what_a_yaml_1_1_reader_retypes():
    # Guards the list: PyYAML (YAML 1.1, the controller's reader) does retype or refuse them
    # when plain, so a chart that wrote them unquoted would fail the tests above.
    retyped = 0
    for text in ["yes", "on", "null", "~", "0x1f", "012", "1:30", ".inf", "=", "<<", "true"]:
        try:
            retyped += yaml.safe_load(f"k: {text}")["k"] != text
        except yaml.YAMLError:
            retyped += 1
    assert retyped == 11


def test_the_check_notices_an_unquoted_value(tmp_path):
    # Guards the test above: the same check fails on a chart that writes one value unquoted.
    chart = tmp_path / "megdet"
    shutil.copytree(CHART_DIR, chart)
    pod = chart / "templates" / "_pod.tpl"
    quoted = "priorityClassName: {{ . | quote }}"
    assert pod.read_text().count(quoted) == 1, "_pod.tpl does not write priorityClassName so"
    pod.write_text(pod.read_text().replace(quoted, "priorityClassName: {{ . }}"))
    with helm_python.Chart.load(str(chart)) as loaded:
        files = loaded.render(
            values={"priorityClassName": "null"}, name=RELEASE, namespace=NAMESPACE, is_install=True
        )
    objects, _ = split_manifests(files)
    with pytest.raises(AssertionError, match="came back as None"):
        assert_each_value_is_in_place(objects, {("priorityClassName",): ("", "null")})
