"""The demo and simulation figures the docs state are the pooled figures of their results
files: ``python -m lad_lab.eval.claims --check`` finds every block up to date, and a block
edited by hand is found stale."""

from __future__ import annotations

import json
import shutil

import pytest

from lad_lab.eval import claims


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


def test_the_ablation_table_needs_ablations_paired_with_the_full_run(tmp_path) -> None:
    """Each ablation row pairs with the full run item for item: its seeds.json must carry the
    versus block on the full run's item seeds, or the table is refused."""
    for name in ["", *(a for a, _, _ in claims.ABLATIONS)]:
        (tmp_path / name).mkdir(exist_ok=True)
        shutil.copy(claims.SIMULATED / name / "seeds.json", tmp_path / name / "seeds.json")
    text = claims.ablation_block(tmp_path)
    assert "| `--tau 1` |" in text and text.count("/5") >= 10
    path = tmp_path / claims.ABLATIONS[0][0] / "seeds.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "item_seeds": [1, 2, 3, 4, 5]}))
    with pytest.raises(ValueError, match="not paired with the full run"):
        claims.ablation_block(tmp_path)
