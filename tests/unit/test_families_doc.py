"""docs/models.md's model-family table is generated from the adapter registry and kept current."""

from __future__ import annotations

from pathlib import Path

from app.models.registry import supported_model_types
from tools.docs import families as families_doc
from tools.docs import model_matrix
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


def test_the_model_matrix_table_is_current() -> None:
    assert model_matrix.main(["--check"]) == 0, "run `python -m tools.docs matrix --write`"


def test_the_matrix_table_has_a_row_per_type_saying_what_was_tested() -> None:
    text = model_matrix.table()
    header = next(line for line in text.splitlines() if line.startswith("| `model_type`"))
    rows = [line for line in text.splitlines() if line.startswith("| `") and line != header]
    served = [row for row in rows if " | served | " in row]
    assert served and all("captured == eager" in row for row in served)
    assert all(
        " | refused | " in row or " | served | " in row or "not built here" in row for row in rows
    )
