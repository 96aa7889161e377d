"""Against a real `lad serve` on the demo model: the README's Python example exactly as
written, and the async client with concurrent requests."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from app.demo.world import make_items
from lad_client import AsyncLadClient, LadError
from tests.live import ROOT, LiveService


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[LiveService]:
    with LiveService(tmp_path_factory.mktemp("live")) as service:
        yield service


def readme_python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


@pytest.mark.slow
def test_the_readme_python_example_runs_as_written(live, tmp_path):
    blocks = readme_python_blocks()
    assert blocks, "the README has no python example"
    env = {**os.environ, "LAD_URL": live.url, "PYTHONPATH": str(ROOT)}
    env.pop("LAD_ADMIN_TOKEN", None)
    for block in blocks:
        done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{block}\n---\n{done.stdout}\n{done.stderr}"
        assert done.stdout.strip(), "the example prints its answer"


@pytest.mark.slow
def test_async_client_sends_concurrent_requests(live):
    items = make_items(8, n_candidates=3, seed="eval")
    calibration = make_items(5, n_candidates=3, seed="calibration")

    async def run() -> list:
        async with AsyncLadClient(live.url, timeout=60) as lad:
            try:
                await lad.retrieve(items[0].query, items[0].images, profile="async")
            except LadError as exc:
                assert exc.code == "calibration_required" and exc.request_id
            done = await lad.calibrate([(i.query, i.images, i.target) for i in calibration],
                                       profile="async")
            assert done.n == 3 and done.profile == "async"
            return await asyncio.gather(*(
                lad.retrieve(i.query, i.images, profile="async") for i in items))

    answers = asyncio.run(run())
    assert len(answers) == 8
    assert all(a.debiased and a.profile.name == "async" and 0 <= a.index < 3 for a in answers)
