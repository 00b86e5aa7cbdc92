"""One image recipe: the Dockerfile's defaults and the documented `docker build` argument sets
([tool.megdet.image.arg_sets], docs/image.md) give the stages `make image` builds.

Each stage is compared on its base and the value of every ARG it declares, read from the
Dockerfile (imagebuild.recipes); `make image`'s side is the arguments its builder passes.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from imagebuild import build as b
from imagebuild import recipes

ROOT = Path(__file__).resolve().parents[2]
COMMIT_SRC = "detectron2 source given"


@pytest.fixture(scope="module")
def data() -> dict:
    return b.pyproject(ROOT)


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return recipes.dockerfile_text(ROOT)


@pytest.fixture(scope="module")
def sets(data) -> dict[str, recipes.ArgSet]:
    return recipes.arg_sets(data)


def make_image_builds(variant: str, with_source: bool) -> bool:
    # The controller has no detectron2: a source changes nothing there.
    return not (with_source and b.VARIANTS[variant].target == "controller")


CASES = [
    (variant, with_source)
    for variant in b.VARIANTS
    for with_source in (False, True)
    if make_image_builds(variant, with_source)
]


def differences(docker: dict, podman: dict) -> list[str]:
    """Where two builds' stages differ, but in what make image supplies itself (LOCAL_ARGS:
    its base image, its mounted detectron2 source, the compile jobs)."""
    out = []
    assert docker.keys() == podman.keys()
    for stage in docker:
        for key in sorted(docker[stage].keys() | podman[stage].keys()):
            if key in (*b.LOCAL_ARGS, "FROM"):
                continue
            if docker[stage].get(key) != podman[stage].get(key):
                out.append(
                    f"{stage}: {key} docker={docker[stage].get(key)!r} "
                    f"podman={podman[stage].get(key)!r}"
                )
    return out


def both_ways(dockerfile, data, sets, variant_name, with_source, base="localhost/megdet-base:x"):
    variant = b.VARIANTS[variant_name]
    commit = data["tool"]["megdet"]["detectron2_commit"] if with_source else None
    chosen = recipes.arg_set_for(sets, variant_name, with_source and variant.target == "train")
    docker = recipes.resolved_stages(dockerfile, variant.target, chosen.args)
    podman_args = b.build_args(variant, data, base, commit, 2, ROOT)
    podman = recipes.resolved_stages(dockerfile, variant.target, podman_args)
    return chosen, docker, podman


@pytest.mark.parametrize(("variant", "with_source"), CASES)
def test_make_image_builds_the_stages_of_its_documented_set(
    dockerfile, data, sets, variant, with_source
):
    chosen, docker, podman = both_ways(dockerfile, data, sets, variant, with_source)
    assert not differences(docker, podman), chosen.name
    defaults = recipes.global_args(dockerfile)
    for stage in docker:
        # The same stages on two bases: the registry's Debian where docker builds, the one
        # make image bootstraps (the same suite) where podman builds.
        assert (
            docker[stage]["FROM"]
            == f"docker.io/library/debian:{b.image_pins(data)['debian_suite']}"
        )
        assert podman[stage]["FROM"] == "localhost/megdet-base:x"
        # The detectron2 commit is the pinned one both ways.
        if "DETECTRON2_COMMIT" in docker[stage]:
            assert docker[stage]["DETECTRON2_COMMIT"] == data["tool"]["megdet"]["detectron2_commit"]
        # A git source: the mounted clone where make image builds, upstream's repository
        # (the default) where docker builds.
        if docker[stage].get("DETECTRON2_SOURCE") == "git":
            assert podman[stage]["DETECTRON2_REPO"] == b.DETECTRON2_MOUNT
            assert docker[stage]["DETECTRON2_REPO"] == defaults["DETECTRON2_REPO"]


def test_the_comparison_sees_a_builder_that_strays_from_its_set(dockerfile, data, sets):
    # The check above is not blind: a builder passing another Python, or a set naming
    # another arch list than the builder uses, differs.
    _, docker, podman = both_ways(dockerfile, data, sets, "train", False)
    podman_args = {**b.build_args(b.VARIANTS["train"], data, "B", None, 2), "PYTHON": "python3.12"}
    strayed = recipes.resolved_stages(dockerfile, "train", podman_args)
    assert differences(docker, strayed) == [
        "train: PYTHON docker='python3.11' podman='python3.12'",
        "build: PYTHON docker='python3.11' podman='python3.12'",
    ]
    other = copy.deepcopy(data)
    other["tool"]["megdet"]["image"]["arg_sets"]["cuda-ops"]["args"]["TORCH_CUDA_ARCH_LIST"] = "8.0"
    _, docker, _ = both_ways(dockerfile, other, recipes.arg_sets(other), "train", True)
    _, _, podman = both_ways(dockerfile, data, sets, "train", True)
    assert differences(docker, podman) == [
        "build: TORCH_CUDA_ARCH_LIST docker='8.0' podman='7.5;8.0;9.0;10.0;12.0+PTX'"
    ]


def test_the_train_target_runs_the_build_stage_and_the_controller_only_its_own(dockerfile):
    assert recipes.stages_of(dockerfile, "train") == ["train", "build"]
    assert recipes.stages_of(dockerfile, "controller") == ["controller"]
    with pytest.raises(recipes.RecipeError, match="no stage 'nope'"):
        recipes.stages_of(dockerfile, "nope")


def test_every_set_names_only_dockerfile_args_and_known_variants(dockerfile, sets):
    defaults = recipes.global_args(dockerfile)
    for arg_set in sets.values():
        assert set(arg_set.args) <= set(defaults), arg_set.name
        assert set(arg_set.variants) <= set(b.VARIANTS), arg_set.name
        # A set says only what differs from the defaults (the default set says nothing).
        assert all(defaults[k] != v for k, v in arg_set.args.items()), arg_set.name
    assert sets["default"].args == {}
    with pytest.raises(recipes.RecipeError, match="NOPE: not ARGs of the Dockerfile"):
        recipes.resolved_stages(dockerfile, "train", {"NOPE": "1"})


def test_each_variant_is_built_with_exactly_one_set(sets):
    for name, variant in b.VARIANTS.items():
        sources = (False, True) if variant.target == "train" else (False,)
        for with_source in sources:
            assert recipes.arg_set_for(sets, name, with_source)


def test_the_v100_set_is_one_cuda_throughout(sets):
    # CUDA 12.6: NVIDIA's images of that CUDA and PyTorch's index of the same tag; Volta
    # (7.0) in the arch list; the CUDA images' Ubuntu 24.04 Python.
    args = sets["cu126"].args
    assert args["BUILD_BASE"] == "docker.io/nvidia/cuda:12.6.3-devel-ubuntu24.04"
    assert args["RUNTIME_BASE"] == args["BUILD_BASE"].replace("-devel-", "-runtime-")
    major, minor = re.search(r"cuda:(\d+)\.(\d+)\.", args["BUILD_BASE"]).groups()
    assert args["TORCH_INDEX_URL"] == f"https://download.pytorch.org/whl/cu{major}{minor}"
    assert "7.0" in args["TORCH_CUDA_ARCH_LIST"].split(";")
    assert args["PYTHON"] == "python3.12"
    assert args["DETECTRON2_SOURCE"] == "git"
    assert sets["cu126"].variants == ()  # needs a registry: make image does not build it


def test_docs_table_is_the_data(sets):
    # docs/image.md's table of recipes is [tool.megdet.image.arg_sets], row for row.
    text = (ROOT / "docs" / "image.md").read_text()
    for arg_set in sets.values():
        flags = f"`{arg_set.build_arg_flags()}`" if arg_set.args else "(none: the defaults)"
        if arg_set.variants:
            src = " --detectron2-src" if arg_set.detectron2_src else ""
            made = ", ".join(f"`{v}{src}`" for v in arg_set.variants)
        else:
            made = "no (needs a container registry)"
        row = f"| `{arg_set.name}` | {flags} | {arg_set.gpus} | {arg_set.detectron2} | {made} |"
        assert row in text, row
