"""The operator chart renders a restricted, probed, HA-ready controller (real Helm engine)."""

from __future__ import annotations

import pytest
from operator_chart_helpers import CI_VALUES, NAMESPACE, render, render_error, values_file

from megdet.cli import build_parser


def controller(rendered):
    deployment = rendered.one("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def test_defaults_render_the_controller_objects_and_nothing_optional() -> None:
    rendered = render()
    kinds = sorted(o["kind"] for o in rendered.objects)
    assert kinds == sorted(
        [
            "ClusterKopfPeering",
            "ClusterRole",
            "ClusterRoleBinding",
            # metrics.secure: the metrics server's review rights (role and binding) and the
            # scrapers' metrics-reader role.
            *("ClusterRole", "ClusterRoleBinding", "ClusterRole"),
            # rbac.aggregateToDefaultRoles: megdet-edit and megdet-view.
            *("ClusterRole", "ClusterRole"),
            # policy: the controller's policy file, the grant for privileged knobs, and the
            # admission policy with its binding.
            *("ConfigMap", "ClusterRole", "ValidatingAdmissionPolicy"),
            "ValidatingAdmissionPolicyBinding",
            # controller.progressEnabled: the progress endpoint's issuer-discovery right, its rights
            # in the release namespace (the shared CA Secret, the active replica's pod label)
            # and its Service.
            *("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service"),
            "Deployment",
            "Service",
            "ServiceAccount",
            # replicaCount 2: the controller's PodDisruptionBudget.
            "PodDisruptionBudget",
        ]
    )
    for obj in rendered.objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "megdet-operator"
        assert labels["app.kubernetes.io/instance"] == "megdet-operator"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/part-of"] == "megdet"


def test_controller_pod_is_restricted() -> None:
    deployment, container = controller(render())
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["runAsNonRoot"] is True
    assert (
        container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    )
    assert container["resources"]["limits"]["memory"]
    # The one writable place: /tmp (HOME points there); the policy is mounted read-only.
    writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
    assert writable == ["/tmp"]
    assert {"name": "HOME", "value": "/tmp"} in container["env"]


def test_probes_and_metrics_port() -> None:
    _, container = controller(render())
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081, "progress": 8443}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    rendered = render()
    service = rendered.named("Service", "megdet-operator-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"},
    ]
    # The training pods' progress reports (controller/progress_server.py): every replica
    # serves them, so the Service selects every controller pod, as the metrics Service does.
    progress = rendered.named("Service", "megdet-operator-progress")
    assert progress["spec"]["ports"] == [
        {"name": "progress", "port": 8443, "targetPort": "progress", "protocol": "TCP"},
    ]
    assert progress["spec"]["selector"] == service["spec"]["selector"]
    deployment, _ = controller(rendered)
    assert deployment["spec"]["selector"]["matchLabels"] == progress["spec"]["selector"]


def test_two_replicas_share_one_progress_ca_and_url() -> None:
    """The default install (2 replicas): one Secret for the CA that every replica uses and the
    URL of the Service that reaches them all (no pod label, so no pod name or namespace in the
    env); with progressCertSecret, that Secret instead and no shared one."""
    rendered = render()
    assert rendered.one("Deployment")["spec"]["replicas"] == 2
    _, container = controller(rendered)
    args = build_parser().parse_args(container["args"])
    assert args.progress_ca_secret == "megdet-system/megdet-operator-progress-ca"
    assert args.progress_url == "https://megdet-operator-progress.megdet-system.svc:8443"
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in
           container["env"]}  # fmt: skip
    assert env["POD_ID"] == "metadata.name" and not {"POD_NAME", "POD_NAMESPACE"} & set(env)
    _, own = controller(render({"controller": {"progressCertSecret": "mine"}}))
    args = build_parser().parse_args(own["args"])
    assert args.progress_ca_secret == "" and args.progress_cert_dir


def test_container_args_parse_with_the_controller_command() -> None:
    # The chart's args are exactly what `megdet controller` accepts (the image's ENTRYPOINT is
    # `megdet`), for every CI values file.
    for values in [{}, *(values_file(p) for p in CI_VALUES)]:
        _, container = controller(render(values))
        args = build_parser().parse_args(container["args"])
        assert args.command == "controller"
        assert args.metrics_port == 8080 and args.health_port == 8081


def test_handler_threads_default_to_four_and_zero_leaves_kopfs_default() -> None:
    _, container = controller(render())
    assert build_parser().parse_args(container["args"]).workers == 4
    _, container = controller(render({"controller": {"workers": 0}}))
    assert not [a for a in container["args"] if a.startswith("--workers")]
    assert build_parser().parse_args(container["args"]).workers is None


def test_worker_limit_defaults_to_the_controllers_and_zero_turns_it_off() -> None:
    from megdet.controller.daemon import DEFAULT_WORKER_LIMIT

    _, container = controller(render())
    assert f"--worker-limit={DEFAULT_WORKER_LIMIT}" in container["args"]  # the chart says it
    assert build_parser().parse_args(container["args"]).worker_limit == DEFAULT_WORKER_LIMIT
    _, container = controller(render({"controller": {"workerLimit": 0}}))
    assert "--worker-limit=0" in container["args"]
    assert build_parser().parse_args(container["args"]).worker_limit == 0


def test_the_allocator_is_the_images_jemalloc_unless_pymalloc_is_asked_for() -> None:
    """controller.allocator: jemalloc (LD_PRELOAD of the image's library, every allocation from
    it) or pymalloc on glibc with at most 2 arenas; either way the image's ENV is overridden."""
    _, container = controller(render())
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LD_PRELOAD"] == "libjemalloc.so.2" and env["PYTHONMALLOC"] == "malloc"
    assert "MALLOC_ARENA_MAX" not in env
    _, container = controller(render({"controller": {"allocator": "pymalloc"}}))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LD_PRELOAD"] == "" and env["PYTHONMALLOC"] == "pymalloc"
    assert env["MALLOC_ARENA_MAX"] == "2"


def test_peering_object_and_args_match() -> None:
    rendered = render(values_file(next(p for p in CI_VALUES if "servicemonitor" in p.name)))
    peering = rendered.one("ClusterKopfPeering")
    _, container = controller(rendered)
    assert peering["metadata"]["name"] == "megdet-controllers"
    assert "--peering=megdet-controllers" in container["args"]
    assert "--priority=100" in container["args"]
    assert rendered.one("Deployment")["spec"]["replicas"] == 3


def test_single_replica_without_peering_is_standalone_and_namespaced() -> None:
    rendered = render(values_file(next(p for p in CI_VALUES if "single" in p.name)))
    _, container = controller(rendered)
    assert "--standalone" in container["args"]
    assert "--namespace=vision" in container["args"] and "--namespace=research" in container["args"]
    assert rendered.of_kind("ClusterKopfPeering") == rendered.of_kind("KopfPeering") == []
    # The run rules are in Roles only (the ClusterRoles left: metrics reviews, user roles).
    assert "megdet-operator" not in {r["metadata"]["name"] for r in rendered.of_kind("ClusterRole")}
    run_roles = [r for r in rendered.of_kind("Role") if r["metadata"]["name"] == "megdet-operator"]
    assert sorted(r["metadata"]["namespace"] for r in run_roles) == ["research", "vision"]


def test_service_monitor_behind_a_flag_with_additional_labels() -> None:
    assert render().of_kind("ServiceMonitor") == []
    rendered = render({"serviceMonitor": {"enabled": True, "additionalLabels": {"release": "kps"}}})
    monitor = rendered.one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    selector = monitor["spec"]["selector"]["matchLabels"]
    service_labels = rendered.named("Service", "megdet-operator-metrics")["metadata"]["labels"]
    assert selector.items() <= service_labels.items()


def test_names_fit_in_63_characters_for_a_long_release() -> None:
    rendered = render(release="a-very-long-release-name-for-the-platform-teams-cluster-operator-x")
    for obj in rendered.objects:
        assert len(obj["metadata"]["name"]) <= 63, obj["metadata"]["name"]


def test_notes_say_what_was_installed_and_what_to_run() -> None:
    notes = render().notes
    assert (
        "Deployment megdet-operator (2 replicas; kopf peering megdet-operator: one acts)" in notes
    )
    assert "kubectl get mdr -w" in notes


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"replicaCount": 0}, ["/replicaCount", "minimum"]),
        ({"image": {"pullPolicy": "Sometimes"}}, ["/image/pullPolicy"]),
        ({"serviceMonitor": {"interval": "30 seconds"}}, ["/serviceMonitor/interval"]),
        ({"controller": {"peering": {"priority": "high"}}}, ["/controller/peering/priority"]),
        (
            {"controller": {"logLevel": "TRACE"}},
            ["/controller/logLevel", "one of 'DEBUG', 'INFO', 'WARNING', 'ERROR'"],
        ),
        # Wrong types in string enums still list the allowed values (the schema leaves their
        # type off; with it Helm answers only "got number, want string").
        ({"controller": {"logLevel": 10}}, ["one of 'DEBUG', 'INFO', 'WARNING', 'ERROR'"]),
        ({"service": {"type": True}}, ["/service/type", "'ClusterIP', 'NodePort'"]),
        (
            {"alerts": {"runFailed": {"severity": 1}}},
            ["/alerts/runFailed/severity", "'critical', 'warning', 'info'"],
        ),
        ({"replicas": 2}, ["replicas", "not allowed"]),
        ({"controller": {"workers": -1}}, ["/controller/workers", "minimum"]),
        ({"controller": {"workers": "four"}}, ["/controller/workers", "integer"]),
        ({"controller": {"workerLimit": -5}}, ["/controller/workerLimit", "minimum"]),
        ({"controller": {"workerLimit": 1.5}}, ["/controller/workerLimit", "integer"]),
        (
            {"controller": {"allocator": "tcmalloc"}},
            ["/controller/allocator", "one of 'jemalloc', 'pymalloc'"],
        ),
        ({"controller": {"allocator": 1}}, ["/controller/allocator", "'jemalloc', 'pymalloc'"]),
        (
            {"replicaCount": 2, "controller": {"peering": {"enabled": False}}},
            ["replicaCount=2 needs controller.peering.enabled=true"],
        ),
    ],
)
def test_bad_values_are_refused_naming_the_value(values, words) -> None:
    error = render_error(values)
    for word in words:
        assert word in error
