"""No issue numbers of this project in code, charts, build files or docs: a comment or a page
says what is true and why, not which ticket asked for it (docs/contributing.md, "Rules").
Upstream references stay: ``kubeflow/trainer#2045``, ``kopf issue #1243``."""

from __future__ import annotations

import re

from tests.repo_files import ROOT, tracked_files

SUFFIXES = (".py", ".tpl", ".yaml", ".yml", ".md", ".sh", ".toml", ".txt", ".json", ".cfg")
NAMES = ("Makefile", "Dockerfile", ".dockerignore")
#: Projects whose issues the code and docs may cite ("kopf issue #1243").
UPSTREAM = (
    "kopf", "kubernetes", "kubeflow", "trainer", "helm", "detectron2", "pytorch", "torch",
    "jobset", "kueue", "volcano", "containerd", "prometheus", "grafana", "nccl", "yacs", "kmock",
)  # fmt: skip
_ISSUE = re.compile(r"(?i)(?:(\b[\w.-]+(?:'s)?)\s+)?(?P<issue>\bissues?\s*#?\d+)")


def issue_numbers(text: str) -> list[str]:
    """Each "issue N" of ``text`` that no upstream project's name precedes."""
    found = []
    for match in _ISSUE.finditer(text):
        before = (match.group(1) or "").lower().removesuffix("'s")
        if before not in UPSTREAM and "/" not in before:
            found.append(match.group("issue"))
    return found


def test_no_issue_numbers_in_code_charts_build_files_or_docs() -> None:
    paths = tracked_files(SUFFIXES, NAMES)
    found = [
        f"{path.relative_to(ROOT)}: {hit}"
        for path in paths
        for hit in issue_numbers(path.read_text(errors="replace"))
    ]
    assert len(paths) > 300
    assert found == []


def test_the_check_notices_a_project_issue_and_keeps_upstream_ones() -> None:
    number = "41"
    text = (
        f"# the whole table (issue {number} item 7)\n"
        f"see Issue #{number}\n"
        "kopf issue #1243 and kopf's issue 1243, kubeflow/trainer#2045, kubernetes#56374\n"
    )
    assert issue_numbers(text) == [f"issue {number}", f"Issue #{number}"]
