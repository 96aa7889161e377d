"""Every example of README.md and docs/*.md runs as written against the service that
`scripts/dev serve` starts (demo model, embedded store), in page order, and says what the
page says it says.

One fresh service per page (a page must not need another page's state), with the
LAD_ADMIN_TOKEN the page exports, on a free port; the page's blocks run in one bash from
the repository root (tests/doc_examples.py), with the python blocks on this interpreter,
which must import ``lad_client``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_examples import PAGES, ROOT, admin_token, outputs, runnable, script
from tests.live import LiveService

RUNNABLE = [p for p in PAGES if runnable(p)]


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE, ids=[p.name for p in RUNNABLE])
def test_page_examples_run_as_written(page: Path, tmp_path: Path) -> None:
    token = admin_token(page)
    env = {"LAD_STORE_URL": str(tmp_path / "profiles")}  # the embedded file store
    if token:
        env["LAD_ADMIN_TOKEN"] = token
    with LiveService(tmp_path, env=env) as live:
        shell_env = {k: v for k, v in os.environ.items() if not k.startswith("LAD_")}
        done = subprocess.run(
            ["bash", "-c", script(page, live.url, sys.executable)],
            cwd=ROOT,
            env=shell_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=900,
        )
    got = outputs(done.stdout)
    blocks = runnable(page)
    last = max((int(k) for k in got if k != "end"), default=-1)
    failed = blocks[last] if 0 <= last < len(blocks) else None
    assert done.returncode == 0 and "end" in got, (
        f"{failed.where if failed else page.name} exited {done.returncode}:\n"
        f"{failed.code if failed else ''}---\n{done.stdout[-4000:]}"
    )
    for k, block in enumerate(blocks):
        for pattern in block.expects:
            assert re.search(pattern, got[str(k)], re.M), (
                f"{block.where}: no match for {pattern!r} in its output:\n{got[str(k)][-3000:]}"
            )
