"""The runnable examples of README.md and docs/*.md: their code blocks, in page order.

A ```bash or ```python block runs unless the line before its fence is ``<!-- no-run -->``
(or ``<!-- no-run: why -->``); each ``<!-- expect: REGEX -->`` line right after a block is
a pattern its output must match (``re.M``). A page's blocks become one bash script, so a
variable or a file one block makes is there for the next; python blocks run as heredocs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES: tuple[Path, ...] = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
DOC_URL = "http://127.0.0.1:8000"
"""The address the examples are written against (replaced by the test server's)."""

MARKER = "@@@LAD-DOC-BLOCK"
_FENCE = re.compile(r"^```([A-Za-z]*)(.*)$")
_EXPECT = re.compile(r"^<!-- expect: (.*) -->$")
_NO_RUN = re.compile(r"^<!-- no-run(: .*)? -->$")
_TOKEN = re.compile(r"^export LAD_ADMIN_TOKEN=(\S+)$", re.M)


@dataclass
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    runs: bool
    expects: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` with its run marker and expectations."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, language, info = i, fence.group(1), fence.group(2)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        runs = language in ("bash", "python") and "no-run" not in info
        runs = runs and not _NO_RUN.match(before.strip())
        block = Block(page, start + 1, language, "\n".join(lines[start + 1 : end]) + "\n", runs)
        i = end + 1
        while i < len(lines) and (expect := _EXPECT.match(lines[i].strip())):
            block.expects.append(expect.group(1))
            i += 1
        found.append(block)
    return found


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.runs]


def admin_token(page: Path) -> str | None:
    """The LAD_ADMIN_TOKEN the page exports (the server must run with the same)."""
    tokens = set(_TOKEN.findall(page.read_text()))
    assert len(tokens) <= 1, f"{page.name} sets LAD_ADMIN_TOKEN to several values: {tokens}"
    return tokens.pop() if tokens else None


def script(page: Path, url: str, python: str) -> str:
    """The page's runnable blocks as one bash script, a marker line before each block."""
    parts = ["set -eo pipefail", f"cd {str(ROOT)!r}"]
    for k, block in enumerate(runnable(page)):
        parts.append(f"printf '\\n{MARKER} {k}@@@\\n'")
        code = block.code.replace(DOC_URL, url)
        if block.language == "python":
            code = f"{python!r} - <<'LAD_DOC_PYTHON_EOF'\n{code}LAD_DOC_PYTHON_EOF\n"
        parts.append(code)
    parts.append(f"printf '\\n{MARKER} end@@@\\n'")
    return "\n".join(parts) + "\n"


def outputs(text: str) -> dict[str, str]:
    """The script's output split at its markers: block number (or "end") -> its output."""
    pieces = re.split(rf"^{MARKER} (\w+)@@@$", text, flags=re.M)
    return {pieces[k]: pieces[k + 1] for k in range(1, len(pieces) - 1, 2)}
