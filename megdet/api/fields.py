"""Every field of a MegDetRun's spec, classified: the policy as an allow-list.

The controller creates a run's job with its own rights, so each spec field is a question of who
may set it. :data:`TABLE` answers it once for every leaf of the CRD's spec schema:

- ``free``: anyone who may create a run may set it (plan numbers, names of the namespace's own
  objects, tuning values of fixed variables);
- ``bounded``: set freely within the policy rules named (``megdet/policy/``'s rules; the
  operator chart's ``policy`` values say what each allows);
- ``granted``: what the rules allow without it, plus more behind a privileged knob
  (``policy.privileged.<knob>`` and the RBAC grant, verb ``use`` on ``megdetruns/privileged``);
- ``not in a pod``: the field reaches the job object or the controller, never a pod.

A leaf is a path in the schema: ``[]`` is a list's item, ``.*`` any key of a map, and for an
object that keeps unknown fields (``x-kubernetes-preserve-unknown-fields``: a Kubernetes type
the CRD does not spell out) any key at any depth below it. Such an entry says which rule bounds
everything a run can put there. ``tests/api/test_fields.py`` walks the CRD and
fails on a leaf the table does not classify, on an entry no leaf has, and on a rule or knob
the policy does not have; docs/operations.md's "Every field a run can set" is :func:`markdown`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from megdet.run_values import recipe_leaves

__all__ = ["CLASSES", "TABLE", "Fields", "leaves", "markdown", "unclassified"]

FREE, BOUNDED, GRANTED, NOT_POD = "free", "bounded", "granted", "not in a pod"
CLASSES = (FREE, BOUNDED, GRANTED, NOT_POD)

#: Marks a leaf that stands for every key below an object or map (see the module doc).
ANY = ".*"


@dataclass(frozen=True)
class Fields:
    """Spec leaves that share one answer: their class, the policy rules that bound them (rule
    names of ``megdet/policy/``), the privileged knobs that open more, and why."""

    paths: tuple[str, ...]
    cls: str
    why: str
    rules: tuple[str, ...] = ()
    knobs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.cls not in CLASSES:
            raise ValueError(f"{self.paths[0]}: class {self.cls!r}; allowed: {CLASSES}")
        if (self.cls == GRANTED) != bool(self.knobs):
            raise ValueError(f"{self.paths[0]}: granted means a knob, and a knob granted")
        if self.cls == BOUNDED and not self.rules:
            raise ValueError(f"{self.paths[0]}: bounded means rules")
        if self.cls in (FREE, NOT_POD) and self.rules:
            raise ValueError(f"{self.paths[0]}: {self.cls} names no rule")


def _under(prefix: str, *tails: str) -> tuple[str, ...]:
    return tuple(f"{prefix}.{t}" if not t.startswith("[") else prefix + t for t in tails)


def _selector(prefix: str) -> tuple[str, ...]:
    return _under(
        prefix,
        "matchLabels.*",
        "matchExpressions[].key",
        "matchExpressions[].operator",
        "matchExpressions[].values[]",
    )


_EGRESS = "spec.networkPolicy.extraEgress[]"
#: The run values of the plan and its recipe (megdet/run_values.py, ``recipe``).
_PLAN = recipe_leaves()
_RUN_POLICY = _under(
    "spec.runPolicy",
    "backoffLimit", "cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
    "suspend",
)  # fmt: skip

TABLE: tuple[Fields, ...] = (
    Fields(
        _PLAN,
        FREE,
        "the plan and its recipe (megdet.plan): numbers and enums the CRD bounds; how many GPUs "
        "a namespace may hold is a ResourceQuota's or Kueue's to say",
    ),
    Fields(
        _under("spec", "runName", "resumeFrom"),
        FREE,
        "the run's folder under /output and the run it continues: the controller's OutputInUse "
        "check and the trainer's folder stamp keep one run per folder",
    ),
    Fields(
        ("spec.config",),
        FREE,
        "a trainer config, shipped or a file on a mounted volume: the trainer refuses one that "
        "sets MEGDET.ALLOW_UNSAFE_WEIGHTS, unsafe weights or a URL _BASE_ (exit 2)",
    ),
    Fields(
        ("spec.extraOverrides.*",),
        FREE,
        "detectron2 config keys: the CRD refuses keys a named field owns (MEGDET."
        "ALLOW_UNSAFE_WEIGHTS among them), and the trainer checks MODEL.WEIGHTS and the like",
    ),
    Fields(
        _under("spec.image", "tag", "pullPolicy"),
        FREE,
        "any tag of an allowed repository, and when the kubelet pulls it",
    ),
    Fields(("spec.image.repository",), BOUNDED, "the training image", ("imageRepositories",)),
    Fields(
        ("spec.imagePullSecrets[].name", "spec.dataset.claimName", "spec.output.claimName"),
        FREE,
        "Secrets (for pulls only) and PVCs of the run's own namespace: the namespace is the "
        "tenancy boundary; the dataset is mounted read-only at /data, the output at /output",
    ),
    Fields(
        _under("spec.dataset", "trainJson", "trainImages", "valJson", "valImages"),
        FREE,
        "paths inside the dataset volume",
    ),
    Fields(
        (
            "spec.shm.sizeLimit",
            *_under("spec.metrics", "enabled", "port"),
            *_under("spec.resources", "qos", "cpu", "memory", "memoryLimit"),
        ),
        FREE,
        "sizes, requests and the metrics port: a namespace's ResourceQuota and LimitRange "
        "bound them",
    ),
    Fields(
        (
            *_under("spec.nccl", "debug", "debugSubsys", "socketIfname", "asyncErrorHandling"),
            *_under("spec.nccl.ib", "enabled", "rdmaResourceCount", "hca", "gidIndex"),
            *_under("spec.nccl.ib", "timeout", "gdrLevel"),
        ),
        FREE,
        "values of NCCL variables the chart sets (names fixed by the chart, values checked by "
        "the CRD)",
    ),
    Fields(
        ("spec.nccl.ib.rdmaResourceName",),
        BOUNDED,
        "the RDMA device plugin's resource",
        ("rdmaResources",),
    ),
    Fields(
        ("spec.nccl.ib.memlock",),
        GRANTED,
        "how RDMA gets unlimited locked memory: from the node's container runtime (non-root); "
        "root with CAP_IPC_LOCK needs the grant",
        knobs=("ibRootMode",),
    ),
    Fields(("spec.gpuResource",), BOUNDED, "the GPU device plugin's resource", ("gpuResources",)),
    Fields(
        ("spec.network.hostNetwork",),
        GRANTED,
        "host networking, outside every NetworkPolicy",
        knobs=("hostNetwork",),
    ),
    Fields(
        ("spec.network.multusNetworks",),
        BOUNDED,
        "Multus secondary networks, outside every NetworkPolicy",
        ("multusNamespaces",),
    ),
    Fields(
        ("spec.gang.enabled", "spec.gang.schedulerName"),
        BOUNDED,
        "the pods' scheduler when gang-scheduled",
        ("schedulers",),
    ),
    Fields(("spec.gang.queue",), BOUNDED, "a cluster-wide Volcano queue", ("gangQueues",)),
    Fields(
        ("spec.kueue.queueName",),
        BOUNDED,
        "the Kueue LocalQueue that admits the job (a label on the job)",
        ("queues", "requireQueue"),
    ),
    Fields(
        ("spec.priorityClassName",),
        BOUNDED,
        "the pods' priority (and preemption of others)",
        ("priorityClasses",),
    ),
    Fields(
        ("spec.serviceAccountName",),
        BOUNDED,
        "the pods' identity (no token for the API server is mounted: only the progress "
        "endpoint's, whose audience the API server refuses)",
        ("serviceAccounts",),
    ),
    Fields(
        ("spec.nodeSelector.*",),
        BOUNDED,
        "node labels the pods require: narrows where they go, never onto reserved nodes",
        ("reservedNodeLabels",),
    ),
    Fields(
        ("spec.affinity.*",),
        BOUNDED,
        "any Kubernetes Affinity: node affinity may not select reserved nodes; pod "
        "(anti-)affinity only narrows where the pods go",
        ("reservedNodeLabels",),
    ),
    Fields(
        ("spec.tolerations[].*",),
        BOUNDED,
        "any Kubernetes Toleration, of the allowed taint keys only",
        ("tolerationKeys",),
    ),
    Fields(
        ("spec.podLabels.*",),
        BOUNDED,
        "pod labels, keys under the allowed prefixes only (a label can match another "
        "NetworkPolicy's or Service's selector)",
        ("labelPrefixes",),
    ),
    Fields(
        ("spec.podAnnotations.*",),
        GRANTED,
        "pod annotations, keys under the allowed prefixes only (mesh, CNI and runtime "
        "annotations change the pods), never Multus' default network; a confining AppArmor or "
        "seccomp profile is free, one that does not confine needs the grant",
        ("annotationPrefixes", "multusDefaultNetwork"),
        ("podSecurity",),
    ),
    Fields(
        ("spec.podSecurityContext.*",),
        GRANTED,
        "any Kubernetes PodSecurityContext: root, group id 0 (runAsGroup, fsGroup, "
        "supplementalGroups), Unconfined profiles, seLinuxOptions and sysctls need the grant; "
        "the rest is what the restricted Pod Security Standard allows",
        ("groupIds",),
        ("podSecurity",),
    ),
    Fields(
        ("spec.extraEnv[].name",),
        BOUNDED,
        "names matching the allowed pattern, none of the reserved ones (what the loader, "
        "Python, torch, iopath/fvcore, NCCL, CUDA and the launcher read, PATH and HOME "
        "included)",
        ("envNames", "loaderEnv"),
    ),
    Fields(
        ("spec.extraEnv[].value",),
        FREE,
        "a literal value of an allowed name",
    ),
    Fields(
        ("spec.extraEnv[].*",),
        BOUNDED,
        "any other EnvVar key (valueFrom): Secrets need secretRefs; a ConfigMap key, the pod's "
        "own fields and resources are the namespace's and the pod's own",
        ("secretRefs",),
    ),
    Fields(
        ("spec.extraVolumes[].*",),
        GRANTED,
        "any Kubernetes Volume of the allowed types, never the output PVC again; hostPath "
        "needs the grant",
        ("volumeTypes", "outputMounts"),
        ("hostPath",),
    ),
    Fields(
        ("spec.extraVolumeMounts[].*",),
        GRANTED,
        "any Kubernetes VolumeMount at a normalized path strictly under the allowed prefixes, "
        "never at, above, under or beside a path the image or the chart uses, never the output "
        "volume again; a mount anywhere else needs the grant",
        ("mountPaths", "outputMounts"),
        ("anyMountPath",),
    ),
    Fields(
        (
            *_under("spec.networkPolicy", "enabled", "restrictEgress", "metricsFrom[].*"),
            *_under(_EGRESS, "ports[].protocol", "ports[].port", "ports[].endPort"),
            *_under(_EGRESS, "to[].ipBlock.cidr", "to[].ipBlock.except[]"),
            *_selector(f"{_EGRESS}.to[].podSelector"),
            *_selector(f"{_EGRESS}.to[].namespaceSelector"),
        ),
        FREE,
        "the run's own NetworkPolicy: it only narrows what reaches the pods and what they "
        "reach (extraEgress re-opens part of what restrictEgress closes, never more than no "
        "policy allows)",
    ),
    Fields(
        ("spec.target", *_RUN_POLICY, "spec.gang.scheduleTimeoutSeconds"),
        NOT_POD,
        "the job's kind, retries, cleanup, deadlines and suspend, and the PodGroup's timeout",
    ),
)


def by_path(table: tuple[Fields, ...] = TABLE) -> dict[str, Fields]:
    """Each classified leaf and its entry; a leaf classified twice raises ValueError."""
    out: dict[str, Fields] = {}
    for entry in table:
        for path in entry.paths:
            if path in out:
                raise ValueError(f"{path}: classified twice")
            out[path] = entry
    return out


def _walk(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, bool]]:
    """(leaf, whether it stands for an object's unknown fields) for a structural schema."""
    properties = schema.get("properties") or {}
    for name, child in properties.items():
        yield from _walk(child, f"{path}.{name}")
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        yield path + ANY, True
    elif properties:
        return
    elif isinstance(schema.get("items"), Mapping):
        yield from _walk(schema["items"], path + "[]")
    elif isinstance(schema.get("additionalProperties"), Mapping):
        yield from _walk(schema["additionalProperties"], path + ANY)
    else:
        yield path, False


def leaves(schema: Mapping[str, Any]) -> list[str]:
    """Every leaf of the spec schema (see the module doc for the path syntax)."""
    return [leaf for leaf, _ in _walk(schema, "spec")]


def unknown_fields(schema: Mapping[str, Any]) -> list[str]:
    """The leaves that stand for every key below an object that keeps unknown fields."""
    return [leaf for leaf, unknown in _walk(schema, "spec") if unknown]


def unclassified(schema: Mapping[str, Any], table: tuple[Fields, ...] = TABLE) -> list[str]:
    """The schema's leaves the table does not classify."""
    known = by_path(table)
    return [leaf for leaf in leaves(schema) if leaf not in known]


def _display(paths: tuple[str, ...]) -> str:
    """Paths as one cell: those sharing a parent written once, ``parent.{a, b}``."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        parent = path.removesuffix(ANY).rpartition(".")[0]
        groups.setdefault(parent, []).append(path[len(parent) + 1 :])
    cells = []
    for parent, names in groups.items():
        inner = names[0] if len(names) == 1 else "{" + ", ".join(names) + "}"
        cells.append(f"`{parent}.{inner}`")
    return ", ".join(cells)


def markdown(table: tuple[Fields, ...] = TABLE) -> str:
    """docs/operations.md's table of every spec field (a test holds the doc equal to it)."""
    lines = [
        "| spec fields | class | bounded by (rules) | grant (knob) | what a run may set |",
        "|---|---|---|---|---|",
    ]
    for entry in table:
        rules = ", ".join(f"`{r}`" for r in entry.rules) or "-"
        knobs = ", ".join(f"`privileged.{k}`" for k in entry.knobs) or "-"
        cells = (_display(entry.paths), entry.cls, rules, knobs, entry.why)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
