"""docs/models.md's model-family table is generated from the adapter registry and kept current."""

from __future__ import annotations

from pathlib import Path

from app.models.registry import supported_model_types
from tools.docs import families as families_doc
from tools.docs.blocks import replace_block, sync


def test_readme_family_table_is_current() -> None:
    assert families_doc.main(["--check"]) == 0, "run `python -m tools.docs families --write`"


def test_every_registered_family_has_a_row_and_its_three_doc_lines() -> None:
    text = families_doc.table()
    for model_type in supported_model_types():
        assert f"`{model_type}`" in text
    assert families_doc.undocumented() == [], "fill doc_layout, doc_pixel_knob, doc_tested"
    header, _rule, *rows = text.splitlines()
    assert len(rows) == len(families_doc.adapters()) + 1  # + the demo model
    assert all(row.count(" | ") == header.count(" | ") for row in rows)


def test_check_fails_on_a_stale_table(tmp_path: Path, monkeypatch) -> None:
    readme = tmp_path / "models.md"
    start, end = families_doc.START, families_doc.END
    current = replace_block(f"intro\n{start}\n{end}\nrest\n", start, end, families_doc.table())
    assert current is not None
    readme.write_text(current)
    assert sync(current, check=True, command="x", page=readme) == 0
    monkeypatch.setattr(families_doc, "PAGE", readme)
    assert families_doc.main(["--check"]) == 0
    # a family whose documentation changed: the page no longer matches
    adapter = families_doc.adapters()[0][1]
    monkeypatch.setattr(adapter, "doc_tested", adapter.doc_tested + " and more")
    assert families_doc.main(["--check"]) == 1
    assert families_doc.main(["--write"]) == 0
    assert "and more" in readme.read_text() and readme.read_text().endswith("rest\n")
    assert families_doc.main(["--check"]) == 0
