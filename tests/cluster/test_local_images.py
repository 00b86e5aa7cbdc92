"""`make cluster` / `make cluster-images` put the images this checkout built into the real node
(cluster.local_images): which archives, and the clear errors of bad input. The import
itself into a real containerd, and a run on it, is tests/e2e/test_e2e_real_training.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import try_locally
import yaml

from cluster import cli, local_images
from cluster.control_plane import Cluster, ClusterError


def megdet_cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def oci_archive(path: Path, name: str) -> Path:
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": "sha256:" + "ab" * 32,
                "size": 1,
                "annotations": {"org.opencontainers.image.ref.name": name},
            }
        ],
    }
    member = path.with_suffix(".index.json")
    member.write_text(json.dumps(index))
    with tarfile.open(path, "w") as tar:
        tar.add(member, arcname="index.json")
    member.unlink()
    return path


class UpCluster(Cluster):
    """A cluster that says it is up, with a real node (nothing runs)."""

    def is_up(self) -> bool:
        return True

    def running(self, name, state) -> bool:
        return True


def up_cluster(root: Path) -> Cluster:
    root.mkdir()
    (root / "state.json").write_text(json.dumps({"pids": {}, "ports": {}, "node": {}}))
    return UpCluster(root=root, echo=lambda line: None)


def test_load_images_without_a_cluster_says_make_cluster(tmp_path: Path) -> None:
    proc = megdet_cluster("load-images", "--state", str(tmp_path / "none"))
    assert proc.returncode == 1
    assert f"no running cluster in {tmp_path / 'none'}: run `make cluster` first" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_newest_archive_of_each_variant_is_what_gets_loaded(tmp_path: Path) -> None:
    old = oci_archive(tmp_path / "megdet-train-ci-0000000000000000.oci.tar", "a:1-ci")
    new = oci_archive(tmp_path / "megdet-train-ci-1111111111111111.oci.tar", "a:1-ci")
    os.utime(old, (1, 1))
    ctl = oci_archive(tmp_path / "megdet-controller-2222222222222222.oci.tar", "c:1")
    oci_archive(tmp_path / "megdet-other-3333333333333333.oci.tar", "x:1")
    (tmp_path / "megdet-train-ci-4444444444444444.oci.json").write_text("{}")
    assert local_images.built_archives(tmp_path) == {"controller": ctl, "train-ci": new}
    assert local_images.resolve([], tmp_path) == [ctl, new]
    assert local_images.resolve(["train-ci"], tmp_path) == [new]
    assert local_images.resolve([str(old)], tmp_path) == [old.resolve()]


def test_an_image_not_built_or_a_missing_archive_is_named(tmp_path: Path) -> None:
    with pytest.raises(ClusterError) as err:
        local_images.resolve(["train"], tmp_path)
    assert "no train image is built" in str(err.value)
    assert "python -m imagebuild.build train" in str(err.value)
    with pytest.raises(ClusterError) as err:
        local_images.resolve(["nope.oci.tar"], tmp_path)
    assert "nope.oci.tar: no such archive file, and not an image variant" in str(err.value)
    assert "controller, train, train-ci" in str(err.value)


def test_with_nothing_built_it_says_what_to_build(tmp_path: Path) -> None:
    said: list[str] = []
    cluster = up_cluster(tmp_path / "c")
    cluster.echo = said.append
    empty = tmp_path / "images"
    empty.mkdir()
    # make cluster: a note, and the cluster stays up.
    assert local_images.load_images(cluster, folder=empty, echo=said.append) == []
    assert said == [f"no image built yet in {empty}: {local_images.BUILD_HINT}"]
    assert "`make suite-images`" in said[0] and "`make image`" in said[0]
    assert "`make cluster-images`" in said[0]
    # make cluster-images: an error.
    with pytest.raises(ClusterError, match="no image built yet"):
        local_images.load_images(cluster, folder=empty, required=True)


def test_a_file_that_is_not_an_oci_archive_is_refused_by_name(tmp_path: Path) -> None:
    cluster = up_cluster(tmp_path / "c")
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    with pytest.raises(ClusterError) as err:
        local_images.load_images(cluster, [str(bad)], folder=tmp_path)
    assert f"{bad}: not an OCI archive" in str(err.value)


def test_a_cluster_without_its_real_node_is_named(tmp_path: Path) -> None:
    class NoNode(UpCluster):
        def running(self, name, state) -> bool:
            return name != "kubelet"

    root = tmp_path / "c"
    root.mkdir()
    (root / "state.json").write_text(json.dumps({"pids": {}, "ports": {}}))
    with pytest.raises(ClusterError) as err:
        local_images.load_images(NoNode(root=root), folder=tmp_path)
    assert "has no real node megdet-node" in str(err.value) and "make cluster" in str(err.value)


def test_make_cluster_links_the_clients_and_loads_what_was_built(tmp_path, monkeypatch) -> None:
    cluster = up_cluster(tmp_path / "c")
    cluster.real_node = True
    calls = []
    monkeypatch.setattr(UpCluster, "up", lambda self, timeout=180: None)
    monkeypatch.setattr(cli, "load_images", lambda c, *a, **k: calls.append(c) or [])
    cli.up(cluster)
    assert calls == [cluster]
    for name in ("kubectl", "helm"):
        link = cluster.root / "bin" / name
        assert link.is_symlink() and os.readlink(link).endswith(f"/{name}")
    # Without a real node (--no-real-node) nothing is loaded.
    cluster.real_node = False
    cli.up(cluster)
    assert calls == [cluster]


# --- README.md's "Try it locally" and examples/local, offline ------------------------------------
EXAMPLE = try_locally.ROOT / "examples" / "local"


def example(name: str) -> list[dict]:
    return list(yaml.safe_load_all((EXAMPLE / name).read_text()))


def test_the_readme_block_is_what_the_e2e_tests_read() -> None:
    steps = try_locally.paragraphs()
    setup = steps["setup"]
    assert [c.split("#")[0].strip() for c in setup[:2]] == ["make suite-images", "make cluster"]
    assert try_locally.environment(Path("/x")).startswith(
        "export KUBECONFIG=/x/kubeconfig PATH=/x/bin:$PATH"
    )
    assert steps["teardown"][0].startswith("make cluster-down")
    assert steps["run chart"][0].startswith("helm install tiny charts/megdet -n megdet-try -f ")
    assert steps["operator"][0].startswith("helm upgrade --install megdet-operator ")
    # Every file the commands name exists, and every make target is the Makefile's.
    makefile = (try_locally.ROOT / "Makefile").read_text()
    for command in (c for group in steps.values() for c in group):
        for word in command.split():
            if word.startswith(("examples/", "charts/")):
                assert (try_locally.ROOT / word).exists(), (word, command)
        if command.startswith("make "):
            assert f"\n{command.split()[1]}:" in makefile, command
    assert "\ncluster-images:" in makefile


def test_a_block_without_its_paragraphs_is_named() -> None:
    text = "intro\n## Try it locally\n\n```bash\nmake cluster\n```\n"
    with pytest.raises(AssertionError, match="has 1 paragraphs, the tests read 5"):
        try_locally.paragraphs(text)


def test_the_local_examples_agree_with_the_images_and_each_other() -> None:
    from cluster.node import pod_placement
    from imagebuild.build import VARIANTS, pyproject, tag_for

    version = pyproject()["project"]["version"]
    (values,) = example("values.yaml")
    (run,) = example("megdetrun.yaml")
    (operator,) = example("operator-values.yaml")
    image = values["image"]
    # The values name the image `make suite-images` builds, which `make cluster` loads.
    assert f"{image['repository']}:{image['tag']}" == tag_for(VARIANTS["train-ci"], version)
    assert image["pullPolicy"] == "Never" and operator["image"]["pullPolicy"] == "Never"
    # The operator's image is the chart's default: the controller image's name and tag.
    chart = yaml.safe_load((try_locally.ROOT / "charts/megdet-operator/Chart.yaml").read_text())
    defaults = yaml.safe_load(
        (try_locally.ROOT / "charts/megdet-operator/values.yaml").read_text()
    )["image"]
    assert "tag" not in operator["image"] and "repository" not in operator["image"]
    assert f"{defaults['repository']}:{chart['appVersion']}" == tag_for(
        VARIANTS["controller"], version
    )
    # The MegDetRun is the same run; both go on the real node.
    assert run["spec"] == {k: v for k, v in values.items() if k != "runName"}
    assert {k: values[k] for k in pod_placement()} == pod_placement()
    assert {k: operator[k] for k in pod_placement()} == pod_placement()
    # The README makes the folders the volumes mount, and the claims are the values'.
    steps = try_locally.paragraphs()["storage"]
    volumes = {d["metadata"]["name"]: d for d in example("volumes.yaml")}
    paths = {
        d["spec"]["claimRef"]["name"]: d["spec"]["hostPath"]["path"]
        for d in volumes.values()
        if d["kind"] == "PersistentVolume"
    }
    assert f"--out {paths['data']} " in steps[0]
    assert steps[1].endswith(f" {paths['output']}") and "-o 10001" in steps[1]
    assert values["dataset"]["claimName"] == "data" and values["output"]["claimName"] == "output"
    assert run["metadata"]["namespace"] in volumes
