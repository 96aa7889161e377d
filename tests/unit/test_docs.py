"""README.md and docs/*.md: every setting documented, links and anchors that resolve inside
the repository, runnable examples well formed, example images current."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from app.settings import Settings
from tests.doc_examples import PAGES, ROOT, admin_token, blocks, outputs, runnable, script
from tools import render_examples

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a page (lower case, punctuation dropped, spaces -> -)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {
        re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", text, flags=re.M)
    }


def test_every_setting_is_in_the_configuration_table() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    table = text.split("## Settings", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`LAD_([A-Z_]+)`", table))
    assert {name.upper() for name in Settings.model_fields} <= documented


def test_links_and_anchors_resolve_inside_the_repository() -> None:
    for page in (*PAGES, ROOT / "deploy" / "README.md"):
        for link in _LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", link):
                continue
            target, _, anchor = link.partition("#")
            path = (page.parent / target).resolve() if target else page
            assert path.exists(), f"{page.name} links to missing {target}"
            assert ROOT in path.parents or path == ROOT, f"{page.name} links outside: {link}"
            if anchor and path.suffix == ".md":
                assert anchor in _anchors(path), f"{page.name}: no #{anchor} in {path.name}"


_SOURCE_TOPS = "app|calibration_store|clients|tools|tests|deploy|scripts"
_REPO_PATH = re.compile(rf"`((?:{_SOURCE_TOPS})/[\w./-]+)`")


def test_the_source_paths_the_pages_name_exist() -> None:
    """A module path in backticks (`app/method/debias.py`) names a file or folder that is
    there, so a move that forgets a page fails here."""
    missing = [
        f"{page.relative_to(ROOT)}: {path}"
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
        for path in _REPO_PATH.findall(page.read_text())
        if not (ROOT / path.rstrip(".,")).exists()
    ]
    assert not missing, missing


def test_the_readme_front_page_is_short_and_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    first = blocks(ROOT / "README.md")[0].code.splitlines()
    commands = [line.split()[:2] for line in first]
    assert commands == [["scripts/dev", "serve"], ["scripts/dev", "test"]]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^scripts/dev test$", ci, flags=re.M), ".ci/run runs the README's command"


def test_examples_are_marked_and_share_one_admin_token() -> None:
    every = [b for page in PAGES for b in blocks(page)]
    assert sum(b.runs for b in every) >= 20
    skipped = [b.where for b in every if b.language in ("bash", "python") and not b.runs]
    assert len(skipped) <= 10, f"no-run is for the few that cannot run here: {skipped}"
    for block in every:
        assert block.runs or not block.expects, f"{block.where}: expectations on a no-run block"
        for pattern in block.expects:
            re.compile(pattern)
    tokens = {admin_token(p) for p in PAGES if runnable(p)} - {None}
    assert len(tokens) == 1, tokens


def test_example_images_exist_and_are_current() -> None:
    named = set()
    for page in PAGES:
        text = page.read_text()
        named |= set(re.findall(r"examples/images/([a-z-]+\.png)", text))
        quoted = re.findall(r'"((?:small|large)-[a-z]+-[a-z]+-[a-z]+-[a-z]+)"', text)
        named |= {f"{n}.png" for n in quoted}
        named |= {f"{n}.png" for n in re.findall(r"\$img/((?:small|large)-[a-z-]+)\.png", text)}
    rendered = set(render_examples.images())
    assert named and named <= rendered, named - rendered
    assert render_examples.main(["--check"]) == 0, "run `python -m tools.render_examples --write`"


def test_a_page_becomes_one_script_and_its_output_splits_per_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        'intro\n\n```bash\nB=http://127.0.0.1:8000\necho "$B"\n```\n'
        "<!-- expect: ^http://x:1$ -->\n\n<!-- no-run -->\n```bash\nexit 1\n```\n\n"
        "```python\nprint(6 * 7)\n```\n<!-- expect: ^42$ -->\n<!-- expect: 4 -->\n"
        "```json\n{}\n```\n"
    )
    found = blocks(page)
    assert [(b.language, b.runs) for b in found] == [
        ("bash", True),
        ("bash", False),
        ("python", True),
        ("json", False),
    ]
    assert found[2].expects == ["^42$", "4"]
    text = script(page, "http://x:1", sys.executable)
    assert "exit 1" not in text and "http://127.0.0.1:8000" not in text
    done = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=60)
    got = outputs(done.stdout)
    assert done.returncode == 0 and got["0"].strip() == "http://x:1" and got["1"].strip() == "42"
    assert "end" in got


def test_the_tools_commands_run_in_the_venv_that_scripts_dev_makes() -> None:
    """`python -m tools.render_examples` with the system Python has no numpy: the pages
    name the interpreter of the .venv that scripts/dev creates, and the command runs."""
    assert 'venv="$root/.venv"' in (ROOT / "scripts" / "dev").read_text()
    readme = re.sub(r"<!--.*?-->", "", (ROOT / "README.md").read_text(), flags=re.S)
    commands = re.findall(r"([\w./]*)python3? -m ([\w.]+)", readme)
    assert (".venv/bin/", "tools.render_examples") in commands
    assert all(where.endswith(".venv/bin/") for where, _ in commands), commands
    for page in PAGES:
        for where in re.findall(r"([\w./]*)python -m tools\.render_examples", page.read_text()):
            assert where.endswith(".venv/bin/"), f"{page.name}: {where}python -m ..."
    done = subprocess.run(
        [sys.executable, "-m", "tools.render_examples", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},  # as typed at the root of a checkout: no PYTHONPATH
    )
    assert done.returncode == 0, done.stderr


def test_hints_name_the_projects_own_set_up_command() -> None:
    """A message that says what to install names `scripts/dev setup` (which installs the
    locked dev dependencies), not an editable pip install the project does not use."""
    hints = [
        f"{path.relative_to(ROOT)}"
        for package in ("app", "lad_lab")
        for path in (ROOT / package).rglob("*.py")
        if 'pip install -e ".[dev]"' in path.read_text()
    ]
    assert hints == []
    assert "scripts/dev setup" in (ROOT / "lad_lab" / "testing" / "qwen_vocab.py").read_text()
    assert "setup [serve|dev]" in (ROOT / "scripts" / "dev").read_text()


def test_each_runnable_page_says_it_runs_against_a_fresh_service() -> None:
    """As the documentation test runs it (tests/e2e/test_doc_examples.py: one service with
    an empty store per page), with the token the page exports; a plain `scripts/dev serve`
    keeps the README's profiles in var/profiles, so the page names the empty store."""
    for page in PAGES:
        if not runnable(page):
            continue
        token = admin_token(page)
        command = "LAD_STORE_URL=memory:// " + (f"LAD_ADMIN_TOKEN={token} " if token else "")
        text = " ".join(page.read_text().split())  # the wrapping undone
        assert f"{command}scripts/dev serve" in text, page.name
        assert "fresh service" in text, page.name
