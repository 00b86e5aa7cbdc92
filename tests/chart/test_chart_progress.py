"""progress.url / progress.caConfigMap: what the pods get for progress reporting (target
pytorchjob), and that a plain `helm install` (no controller) gets none of it."""

from __future__ import annotations

from chart_helpers import NAMESPACE, RELEASE, env_of

BASE = "https://megdet-operator-metrics.megdet-system.svc:8443"
URL = f"{BASE}/apis/megdet.io/v1alpha1/namespaces/{NAMESPACE}/megdetruns/{RELEASE}/status"
PROGRESS = {"progress": {"url": BASE, "caConfigMap": f"{RELEASE}-progress-ca"}}
ENV_NAMES = (
    "KUBEFLOW_TRAINER_SERVER_URL",
    "KUBEFLOW_TRAINER_SERVER_CA_CERT",
    "KUBEFLOW_TRAINER_SERVER_TOKEN",
)


def test_progress_values_inject_env_token_and_ca_into_every_container(render) -> None:
    rendered = render({"gpus": 16, "gpusPerNode": 8, **PROGRESS})
    roles = set()
    for role, spec in rendered.pod_specs():
        roles.add(role)
        assert spec["automountServiceAccountToken"] is False  # no API token, only the audience's
        (volume,) = [v for v in spec["volumes"] if v["name"] == "megdet-progress"]
        token, ca = volume["projected"]["sources"]
        assert token["serviceAccountToken"] == {
            "audience": f"megdet.io/v1alpha1/namespaces/{NAMESPACE}/megdetruns/{RELEASE}/status",
            "expirationSeconds": 3600,
            "path": "token",
        }
        assert ca["configMap"] == {
            "name": f"{RELEASE}-progress-ca",
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
        }
        for container in spec["containers"]:
            env = env_of(container)
            assert env["KUBEFLOW_TRAINER_SERVER_URL"] == URL
            (mount,) = [m for m in container["volumeMounts"] if m["name"] == "megdet-progress"]
            assert mount["readOnly"] is True
            assert env["KUBEFLOW_TRAINER_SERVER_TOKEN"] == f"{mount['mountPath']}/token"
            assert env["KUBEFLOW_TRAINER_SERVER_CA_CERT"] == f"{mount['mountPath']}/ca.crt"
    assert roles == {"Master", "Worker"}


def test_no_progress_without_url(render) -> None:
    rendered = render({"gpus": 16, "gpusPerNode": 8})
    for _role, spec in rendered.pod_specs():
        assert all(v["name"] != "megdet-progress" for v in spec["volumes"])
        for container in spec["containers"]:
            assert not set(ENV_NAMES) & set(env_of(container))
            assert all(m["name"] != "megdet-progress" for m in container["volumeMounts"])


def test_user_extra_env_still_comes_after_progress_env(render) -> None:
    rendered = render({**PROGRESS, "extraEnv": [{"name": "A", "value": "1"}]})
    (_role, container), *_ = rendered.containers()
    names = [e["name"] for e in container["env"]]
    assert names.index("KUBEFLOW_TRAINER_SERVER_URL") < names.index("A")


def test_trainjob_target_gets_no_megdet_progress(render) -> None:
    """Trainer v2 injects its own status server's env and token into a TrainJob's pods."""
    rendered = render({"target": "trainjob", **PROGRESS})
    text = repr(rendered.objects)
    assert "megdet-progress" not in text
    assert "KUBEFLOW_TRAINER_SERVER_URL" not in text


def test_url_without_ca_config_map_is_refused_naming_both(render) -> None:
    message = render.error({"progress": {"url": BASE, "caConfigMap": ""}})
    assert "progress.caConfigMap" in message and "progress.url" in message


def test_url_must_be_https(render) -> None:
    message = render.error({"progress": {"url": "http://x:8443/", "caConfigMap": "ca"}})
    assert "/progress/url" in message and "https://" in message
