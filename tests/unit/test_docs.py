"""The README and docs/design.md: every setting documented, links that resolve inside the
repository, nothing pointing outside it."""

from __future__ import annotations

import re
from pathlib import Path

from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_every_setting_is_in_the_readme_table():
    table = README.split("## Settings", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`LAD_([A-Z_]+)`", table))
    assert {name.upper() for name in Settings.model_fields} <= documented


def test_relative_links_resolve_inside_the_repository():
    for doc in (ROOT / "README.md", ROOT / "docs" / "design.md"):
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path = (doc.parent / target).resolve()
            assert path.exists(), f"{doc.name} links to missing {target}"
            assert ROOT in path.parents or path == ROOT, f"{doc.name} links outside: {target}"


def test_readme_anchors_into_the_design_doc_exist():
    design = (ROOT / "docs" / "design.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", design, flags=re.M)
    }
    for anchor in re.findall(r"docs/design\.md#([a-z0-9-]+)", README):
        assert anchor in anchors, anchor
