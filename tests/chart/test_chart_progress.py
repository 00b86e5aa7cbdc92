"""progress.url / progress.caConfigMap / progress.runUID: what the pods get for progress
reporting (target pytorchjob), and that a plain `helm install` (no controller) gets none of
it."""

from __future__ import annotations

from chart_helpers import NAMESPACE, RELEASE, env_of

from megdet import progress as protocol

BASE = "https://megdet-operator-progress.megdet-system.svc:8443"
URL = f"{BASE}/apis/megdet.io/v1alpha1/namespaces/{NAMESPACE}/megdetruns/{RELEASE}/status"
UID = "6f0c1d2e-3a4b-4c5d-8e9f-0a1b2c3d4e5f"
PROGRESS = {"progress": {"url": BASE, "caConfigMap": f"{RELEASE}-progress-ca", "runUID": UID}}
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
            "audience": protocol.run_audience(NAMESPACE, RELEASE, UID),
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
    message = render.error({"progress": {"url": BASE, "caConfigMap": "", "runUID": UID}})
    assert "progress.caConfigMap" in message and "progress.url" in message


def test_the_audience_names_the_run_uid(render) -> None:
    """The token audience ends with the run's uid, so a run created again under the same name
    (a new uid) gets tokens the old run's pods never held, and the other way round."""
    audiences = set()
    for uid in (UID, "0a0a0a0a-1b1b-4c4c-8d8d-9e9e9e9e9e9e"):
        rendered = render({**PROGRESS, "progress": {**PROGRESS["progress"], "runUID": uid}})
        for _role, spec in rendered.pod_specs():
            (volume,) = [v for v in spec["volumes"] if v["name"] == "megdet-progress"]
            audience = volume["projected"]["sources"][0]["serviceAccountToken"]["audience"]
            assert audience == (
                f"megdet.io/v1alpha1/namespaces/{NAMESPACE}/megdetruns/{RELEASE}/status/{uid}"
            )
            audiences.add(audience)
    assert len(audiences) == 2


def test_url_without_run_uid_is_refused_naming_it(render) -> None:
    message = render.error({"progress": {**PROGRESS["progress"], "runUID": ""}})
    assert "progress.runUID" in message and "progress.url" in message


def test_url_must_be_https(render) -> None:
    message = render.error(
        {"progress": {"url": "http://x:8443/", "caConfigMap": "ca", "runUID": UID}}
    )
    assert "/progress/url" in message and "https://" in message
