"""The docs' generated tables (megdet/api/docs_tables.py, ``make doc-tables``) are what
their sources make now, and the writer touches nothing outside their markers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from megdet.api import docs_tables
from megdet.api.docs_tables import END, ROOT, TABLES, main, stale, write


def _copy(tmp_path: Path) -> Path:
    for rel in [*(t.page for t in TABLES), "charts/megdet/values.yaml"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_committed_tables_are_the_generated_ones():
    assert stale() == [], "run make doc-tables"
    assert main(["--check"]) == 0


def test_stale_check_notices_an_edited_default_and_the_writer_fixes_only_the_block(tmp_path):
    root = _copy(tmp_path)
    values = root / "charts/megdet/values.yaml"
    values.write_text(values.read_text().replace("\nbnGroupSize: 0\n", "\nbnGroupSize: 4\n"))
    page = root / "docs/helm.md"
    before = page.read_text()
    assert stale(root) == ["docs/helm.md (from megdet/run_values.py)"]
    assert write(root) == ["docs/helm.md"]
    after = page.read_text()
    assert "| `bnGroupSize` | `4` | key | `MEGDET.BN_GROUP_SIZE` | yes |" in after
    start = before.index(TABLES[0].start)
    assert after[:start] == before[:start]
    assert after[after.index(END) :] == before[before.index(END) :]
    assert stale(root) == []


def test_a_hand_edited_table_is_stale(tmp_path):
    root = _copy(tmp_path)
    page = root / "docs/operations.md"
    page.write_text(page.read_text().replace("| free |", "| bounded |", 1))
    assert stale(root) == ["docs/operations.md (from megdet/api/fields.py)"]


def test_a_page_without_its_markers_is_named_with_the_markers(tmp_path, monkeypatch, capsys):
    root = _copy(tmp_path)
    page = root / "docs/helm.md"
    page.write_text(page.read_text().replace(END, ""))
    with pytest.raises(ValueError, match=r"docs/helm\.md: needs one block from"):
        stale(root)
    monkeypatch.setattr(docs_tables.stale, "__defaults__", (root,))
    assert main(["--check"]) == 2
    assert "megdet/run_values.py" in capsys.readouterr().err
