"""The image recipes: the Dockerfile's stages and build arguments, and the named sets of
arguments over its defaults (pyproject.toml ``[tool.megdet.image.arg_sets]``) that a
``docker build`` takes and that ``make image`` builds its variants with (docs/image.md,
"Build arguments").

A stage's recipe is its base (the ``FROM`` with the global ``ARG``s substituted) and the value
of every ``ARG`` it declares: what ``docker build --build-arg ...`` with a set and ``make image``
with its own arguments are compared on (tests/image/test_arg_sets.py).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path


class RecipeError(Exception):
    """A Dockerfile or an arg set that cannot be read; the message names what and where."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One ``FROM ... AS name`` stage: its base expression, the ``ARG``s it declares (with a
    default of its own, or None to take the global one) and the stages it copies from."""

    name: str
    base: str
    args: dict[str, str | None]
    copies_from: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ArgSet:
    """One recipe: ``docker build`` arguments over the Dockerfile's defaults, and the
    ``make image`` variants that build it (with a detectron2 source or without)."""

    name: str
    gpus: str
    detectron2: str
    variants: tuple[str, ...]
    detectron2_src: bool
    args: dict[str, str]

    def build_arg_flags(self) -> str:
        """The ``docker build`` flags, as a user types them ("" for the defaults)."""
        return " ".join(f'--build-arg {k}="{v}"' for k, v in self.args.items())


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        current += " " + stripped.removesuffix("\\") if current else stripped.removesuffix("\\")
        if not stripped.endswith("\\"):
            keyword, _, rest = current.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
            current = ""
    return out


def stage_instructions(text: str) -> dict[str, list[tuple[str, str]]]:
    """Instructions by stage name ("global" for the ARGs before the first FROM)."""
    result: dict[str, list[tuple[str, str]]] = {"global": []}
    name = "global"
    for keyword, rest in instructions(text):
        if keyword == "FROM":
            name = rest.split(" AS ")[-1].strip() if " AS " in rest else rest
            result[name] = []
        result[name].append((keyword, rest))
    return result


def _arg(rest: str) -> tuple[str, str | None]:
    name, eq, default = rest.partition("=")
    return name.strip(), default.strip().strip('"') if eq else None


def global_args(text: str) -> dict[str, str]:
    """The ``ARG``s before the first ``FROM`` and their defaults (only ARGs may stand there)."""
    args = {}
    for keyword, rest in stage_instructions(text)["global"]:
        if keyword != "ARG":
            raise RecipeError(f"Dockerfile: only ARGs may precede the first FROM, found {keyword}")
        name, default = _arg(rest)
        args[name] = default or ""
    return args


def stages(text: str) -> dict[str, Stage]:
    """The Dockerfile's stages by name, in order."""
    out = {}
    for name, body in stage_instructions(text).items():
        if name == "global":
            continue
        base = body[0][1].split(" AS ")[0].strip()
        args = dict(_arg(rest) for keyword, rest in body if keyword == "ARG")
        froms = re.findall(r"--from=(\S+)", " ".join(r for k, r in body if k in ("COPY", "ADD")))
        out[name] = Stage(name, base, args, tuple(dict.fromkeys(froms)))
    return out


def stages_of(text: str, target: str) -> list[str]:
    """``target`` and every stage it copies from, directly or not: what a build of it runs."""
    all_stages = stages(text)
    if target not in all_stages:
        raise RecipeError(f"Dockerfile: no stage {target!r}; stages: {', '.join(all_stages)}")
    seen: list[str] = []
    todo = [target]
    while todo:
        name = todo.pop()
        if name in seen or name not in all_stages:
            continue  # an external image's name, not a stage
        seen.append(name)
        todo.extend(all_stages[name].copies_from)
    return seen


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """``${NAME}`` and ``$NAME`` replaced by their values (unknown names: empty, as Docker)."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2), ""), expr)


def resolved_stages(text: str, target: str, build_args: Mapping[str, str]) -> dict:
    """What a build of ``target`` with ``build_args`` gives each stage it runs: ``FROM`` (the base
    image) and the value of each ``ARG`` the stage declares."""
    defaults = global_args(text)
    unknown = sorted(set(build_args) - set(defaults) - _stage_only_args(text))
    if unknown:
        raise RecipeError(f"build args {', '.join(unknown)}: not ARGs of the Dockerfile")
    values = {**defaults, **build_args}
    all_stages = stages(text)
    out = {}
    for name in stages_of(text, target):
        stage = all_stages[name]
        resolved = {"FROM": substitute(stage.base, values)}
        for arg, own_default in stage.args.items():
            if arg in build_args:
                resolved[arg] = build_args[arg]
            else:
                resolved[arg] = own_default if own_default is not None else defaults.get(arg, "")
        out[name] = resolved
    return out


def _stage_only_args(text: str) -> set[str]:
    return {arg for stage in stages(text).values() for arg in stage.args}


def arg_sets(pyproject: Mapping) -> dict[str, ArgSet]:
    """``[tool.megdet.image.arg_sets]``, by name."""
    try:
        table = pyproject["tool"]["megdet"]["image"]["arg_sets"]
    except KeyError as exc:
        raise RecipeError("pyproject.toml has no [tool.megdet.image.arg_sets]") from exc
    return {
        name: ArgSet(
            name,
            entry["gpus"],
            entry["detectron2"],
            tuple(entry["variants"]),
            bool(entry["detectron2_src"]),
            {k: str(v) for k, v in entry["args"].items()},
        )
        for name, entry in table.items()
    }


def arg_set_for(sets: Mapping[str, ArgSet], variant: str, detectron2_src: bool) -> ArgSet:
    """The one set that ``make image`` builds ``variant`` with (with a detectron2 source or not)."""
    found = [
        s for s in sets.values() if variant in s.variants and s.detectron2_src == detectron2_src
    ]
    if len(found) != 1:
        names = ", ".join(s.name for s in found) or "none"
        source = "with" if detectron2_src else "without"
        raise RecipeError(
            f"[tool.megdet.image.arg_sets]: variant {variant!r} {source} a detectron2 source "
            f"needs exactly one set, found {names}"
        )
    return found[0]


def dockerfile_text(root: Path) -> str:
    return (root / "Dockerfile").read_text()
