"""`megdet controller` progress flags and the shared CA Secret's errors: exit 2 or a ValueError
naming the flag, never a traceback."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes import client as k8s

from megdet.cli import main
from megdet.controller.progress_ca import ServingCert


@pytest.mark.parametrize("value", ["megdet-system", "Megdet/ca", "ns/", "/ca", "ns/ca/x", "ns/-ca"])
def test_a_bad_progress_ca_secret_exits_2_naming_it(value, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["controller", "--progress-url=https://op.ops.svc:8443",
              f"--progress-ca-secret={value}"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--progress-ca-secret" in err and "NAMESPACE/NAME" in err
    assert "Traceback" not in err


async def test_a_shared_secret_that_does_not_load_names_the_flag(cluster) -> None:
    cluster.objects["v1/secrets", "ops", "ca"] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "ca", "namespace": "ops"},
        "data": {"ca.crt": "bm90IGEgY2VydA=="},
    }
    config = k8s.Configuration()
    config.host = str(cluster.url)
    api = k8s.ApiClient(config)
    with pytest.raises(ValueError, match=r"--progress-ca-secret ops/ca: needs ca.crt, tls.crt"):
        await asyncio.to_thread(ServingCert.shared, api, 5.0, "ops", "ca", ["op.ops.svc"])
    # None there: made once, and the next replica reads the same one.
    first = await asyncio.to_thread(ServingCert.shared, api, 5.0, "ops", "new", ["op.ops.svc"])
    again = await asyncio.to_thread(ServingCert.shared, api, 5.0, "ops", "new", ["op.ops.svc"])
    assert first.ca_pem == again.ca_pem and "BEGIN CERTIFICATE" in first.ca_pem
