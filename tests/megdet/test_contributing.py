"""docs/contributing.md's checklists name what exists: every file of this repository a step
names is there, every test it names is defined under tests/, and every step names a file and
the test that fails when the step is missed (or says that no test does)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs/contributing.md"
CHECKLISTS = (
    "Adding a run value (a `MegDetRun` spec field)",
    "Adding a status field",
    "Changing the image's contents",
)
#: Where a path of this repository starts (anything else in backticks is upstream's or a name).
TOP = (*(p.name for p in ROOT.iterdir() if not p.name.startswith(".")), ".dockerignore")


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def steps(section: str) -> list[str]:
    """The numbered steps of a checklist (each with its continuation lines)."""
    out = []
    for step in re.split(r"^\d+\. ", section, flags=re.MULTILINE)[1:]:
        first, *rest = step.split("\n")
        end = next((i for i, line in enumerate(rest) if line and not line[0].isspace()), None)
        out.append("\n".join([first, *rest[:end]]))
    return out


def repo_paths(text: str) -> list[str]:
    names = re.findall(r"`([\w./*<>-]+)`", text) + re.findall(r"\(([\w./-]+\.md)[#)]", text)
    out = []
    for name in names:
        name = name.split("#")[0]
        first = name.split("/")[0]
        if (first in TOP and ("/" in name or "." in name)) or name.startswith("docs/"):
            out.append(name)
        elif name.endswith(".md") and "/" not in name:
            out.append(f"docs/{name}")
    return out


def named_tests(text: str) -> list[str]:
    return re.findall(r"`(test_\w+)`", text)


def defined_tests() -> set[str]:
    return {
        m
        for path in (ROOT / "tests").rglob("*.py")
        for m in re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE)
    }


def problems(text: str, defined: set[str]) -> list[str]:
    found = []
    parts = sections(text)
    for title in CHECKLISTS:
        if title not in parts:
            found.append(f"no section '## {title}'")
            continue
        listed = steps(parts[title])
        if not listed:
            found.append(f"{title}: no numbered steps")
        for number, step in enumerate(listed, 1):
            where = f"{title}, step {number}"
            paths = repo_paths(step)
            for path in paths:
                if "<" in path or "*" in path:
                    if not any(ROOT.glob(re.sub(r"<[^>]*>", "*", path))):
                        found.append(f"{where}: nothing matches {path}")
                elif not (ROOT / path).exists():
                    found.append(f"{where}: no file {path}")
            for name in named_tests(step):
                if name not in defined:
                    found.append(f"{where}: no test {name}")
            if not paths:
                found.append(f"{where}: names no file")
            if (
                not named_tests(step)
                and "tests/" not in step
                and "no test" not in " ".join(step.lower().split())
            ):
                found.append(f"{where}: names no test (or says no test catches it)")
    return found


@pytest.fixture(scope="module")
def defined() -> set[str]:
    return defined_tests()


def test_every_checklist_step_names_real_files_and_tests(defined):
    assert problems(PAGE.read_text(), defined) == []


def test_the_check_notices_a_moved_file_a_renamed_test_and_a_step_without_a_test(defined):
    text = PAGE.read_text()
    run_values = sections(text)[CHECKLISTS[0]]
    first = steps(run_values)[0]
    planted = text.replace(first, first.replace("megdet/run_values.py", "megdet/values.py"), 1)
    assert f"{CHECKLISTS[0]}, step 1: no file megdet/values.py" in problems(planted, defined)
    (name, *_) = named_tests(first)
    planted = text.replace(first, first.replace(name, name + "_x"), 1)
    assert f"{CHECKLISTS[0]}, step 1: no test {name}_x" in problems(planted, defined)
    planted = text.replace(
        "## Adding a status field\n", "## Adding a status field\n\n1. `Makefile`: nothing.\n", 1
    )
    assert "Adding a status field, step 1: names no test (or says no test catches it)" in problems(
        planted, defined
    )
