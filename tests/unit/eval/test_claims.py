"""The demo and simulation figures the docs state are the pooled figures of their results
files: ``python -m app.eval.claims --check`` finds every block up to date, and a block
edited by hand is found stale."""

from __future__ import annotations

import pytest

from app.eval import claims


def test_every_docs_block_matches_its_results_file() -> None:
    assert claims.main(["--check"]) == 0


def test_an_edited_block_is_stale_and_rewritten(tmp_path, monkeypatch) -> None:
    page = tmp_path / "page.md"
    start, end = claims.markers("demo")
    page.write_text(f"before\n{start}\n| hand-written 99.9 |\n{end}\nafter\n")
    monkeypatch.setattr(claims, "BLOCKS", {"demo": (page, claims.demo_block)})
    monkeypatch.setattr(claims, "ROOT", tmp_path)
    assert claims.main(["--check"]) == 1
    assert claims.main([]) == 0 and claims.main(["--check"]) == 0
    text = page.read_text()
    assert "99.9" not in text and text.startswith("before\n") and text.endswith("\nafter\n")
    assert "| N=4 Adversarial |" in text and "/5 |" in text
    with pytest.raises(ValueError, match="claims:x:start"):
        claims.rewrite("no markers", "x", "body")
