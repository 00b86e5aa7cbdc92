"""`megdet validate --kubeconfig/--server-dry-run`: flag parsing and every error path, without a
cluster (a stand-in HTTP API server answers what a real one would; tests/e2e/
test_e2e_validate_server.py runs the real one)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from megdet.api.cli import refusal_lines
from tests.json_http import JsonHandler

REPO = Path(__file__).resolve().parents[2]
RUN = """\
apiVersion: megdet.io/v1alpha1
kind: MegDetRun
metadata: {name: fine}
spec: {gpus: 16}
"""


def megdet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "megdet", "validate", *args],
        input=RUN,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**environ, **(env or {})},
    )


def write_kubeconfig(path: Path, server: str, namespace: str | None = None) -> Path:
    context = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "ctx", "context": context}],
                "current-context": "ctx",
            }
        )
    )
    return path


class FakeServer:
    """Answers every POST with ``status`` and ``body``; records the requests' paths."""

    def __init__(self) -> None:
        self.status = 200
        self.body: dict = {}
        self.paths: list[str] = []
        fake = self

        class Handler(JsonHandler):
            def do_POST(self) -> None:
                sent = self.read_json()
                fake.paths.append(self.path)
                body = fake.body if fake.body else sent
                if fake.status == 200 and not fake.body:  # echo, as a dry run with defaults
                    body = {**sent, "metadata": {**sent["metadata"], "uid": "u-1"}}
                    body["metadata"].setdefault("namespace", self.path.split("/")[5])
                self.reply_json(fake.status, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture()
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    thread = threading.Thread(target=fake.httpd.serve_forever, daemon=True)
    thread.start()
    yield fake
    fake.httpd.shutdown()
    fake.httpd.server_close()


def assert_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    for word in words:
        assert word in errors[0], errors[0]


def test_help_says_which_mode_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "megdet", "validate", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    text = " ".join(result.stdout.split())
    assert "Offline (the default)" in text and "dryRun=All" in text
    for flag in ("--kubeconfig", "--server-dry-run", "--context", "--namespace"):
        assert flag in text


def test_kubeconfig_env_alone_keeps_the_offline_mode(tmp_path) -> None:
    # $KUBECONFIG names a server nobody listens on: offline mode never reads it.
    config = write_kubeconfig(tmp_path / "kc", "https://127.0.0.1:1")
    result = megdet("-f", "-", env={"KUBECONFIG": str(config)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "<stdin>#0 MegDetRun/fine: valid\n"
    assert "server dry-run" not in result.stderr


@pytest.mark.parametrize("flag", [["--context", "ctx"], ["--namespace", "team"]])
def test_context_and_namespace_need_server_mode(flag) -> None:
    assert_error(megdet("-f", "-", *flag), flag[0], "--kubeconfig or --server-dry-run")


def test_missing_kubeconfig_names_the_flag(tmp_path) -> None:
    missing = tmp_path / "nope"
    assert_error(megdet("-f", "-", "--kubeconfig", str(missing)), "--kubeconfig", str(missing))
    result = megdet("-f", "-", "--server-dry-run", env={"KUBECONFIG": str(missing)})
    assert_error(result, "$KUBECONFIG", str(missing))


def test_unknown_context_lists_the_known_ones(tmp_path) -> None:
    config = write_kubeconfig(tmp_path / "kc", "https://127.0.0.1:1")
    result = megdet("-f", "-", "--kubeconfig", str(config), "--context", "prod")
    assert_error(result, "--context", "'prod'", "ctx")


def test_unreachable_server_is_one_line(tmp_path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = write_kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{port}")
    assert_error(megdet("-f", "-", "--kubeconfig", str(config)), "--kubeconfig", "cannot reach")


def test_forbidden_by_rbac_is_an_error_not_a_verdict(tmp_path, server) -> None:
    server.status = 403
    server.body = {
        "kind": "Status",
        "status": "Failure",
        "reason": "Forbidden",
        "code": 403,
        "message": 'megdetruns.megdet.io is forbidden: User "u" cannot create resource '
        '"megdetruns" in API group "megdet.io" in the namespace "default"',
    }
    config = write_kubeconfig(tmp_path / "kc", server.url)
    result = megdet("-f", "-", "--kubeconfig", str(config))
    assert_error(result, "--kubeconfig", "HTTP 403", "cannot create resource")


def test_missing_namespace_names_the_namespace_flag(tmp_path, server) -> None:
    server.status = 404
    server.body = {"kind": "Status", "code": 404, "message": 'namespaces "team" not found'}
    config = write_kubeconfig(tmp_path / "kc", server.url)
    result = megdet("-f", "-", "--kubeconfig", str(config), "-n", "team")
    assert_error(result, "--namespace", 'namespaces "team" not found')
    assert server.paths[0].startswith("/apis/megdet.io/v1alpha1/namespaces/team/megdetruns?")


def test_the_dry_run_request_and_the_controller_checks_on_its_answer(tmp_path, server) -> None:
    config = write_kubeconfig(tmp_path / "kc", server.url, namespace="from-context")
    result = megdet("-f", "-", "--kubeconfig", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "<stdin>#0 MegDetRun/fine: valid (API server dry-run and controller checks)\n"
    )
    assert f"server dry-run at {server.url}" in result.stderr
    (path,) = server.paths
    assert path.startswith("/apis/megdet.io/v1alpha1/namespaces/from-context/megdetruns?")
    assert "dryRun=All" in path and "fieldValidation=Strict" in path
    # What the server accepted still goes through the controller's own checks: a spec whose
    # CRD checks pass only because this stand-in server has none is refused by the plan.
    server.body = {
        "apiVersion": "megdet.io/v1alpha1",
        "kind": "MegDetRun",
        "metadata": {"name": "fine", "namespace": "from-context", "uid": "u-1"},
        "spec": {"gpus": 12, "gpusPerNode": 8},
    }
    result = megdet("-f", "-", "--kubeconfig", str(config))
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout.startswith("<stdin>#0 MegDetRun/fine: spec.gpus: ")


def test_refusals_become_one_line_per_field() -> None:
    invalid = {
        "code": 422,
        "message": 'MegDetRun.megdet.io "r" is invalid: ...',
        "details": {
            "causes": [
                {"field": "spec.gpus", "message": "Invalid value: 12: gpus above ..."},
                {"field": "spec.syncBN", "message": 'Unsupported value: "partial"'},
            ]
        },
    }
    assert refusal_lines(422, json.dumps(invalid)) == [
        "spec.gpus: Invalid value: 12: gpus above ...",
        'spec.syncBN: Unsupported value: "partial"',
    ]
    denied = {
        "code": 403,
        "message": "megdetruns.megdet.io \"r\" is forbidden: ValidatingAdmissionPolicy 'p' with "
        "binding 'b' denied request: spec.image.repository: x (policy.imageRepositories: y)",
    }
    assert refusal_lines(403, json.dumps(denied)) == [
        "spec.image.repository: x (policy.imageRepositories: y)"
    ]
    strict = {"code": 400, "message": 'strict decoding error: unknown field "spec.bogus"'}
    assert refusal_lines(400, json.dumps(strict)) == [strict["message"]]
    rbac = {"code": 403, "message": 'User "u" cannot create resource "megdetruns"'}
    assert refusal_lines(403, json.dumps(rbac)) is None
    assert refusal_lines(500, "oops") is None
