"""Against a real `lad serve` on the demo model: the async client with concurrent requests
(the documentation's examples run in tests/e2e/test_doc_examples.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from lad_client import AsyncLadClient, LadError
from lad_lab.demo.world import make_items
from tests.live import LiveService


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[LiveService]:
    with LiveService(tmp_path_factory.mktemp("live")) as service:
        yield service


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
            done = await lad.calibrate(
                [(i.query, i.images, i.target) for i in calibration], profile="async"
            )
            assert done.n == 3 and done.profile == "async"
            return await asyncio.gather(
                *(lad.retrieve(i.query, i.images, profile="async") for i in items)
            )

    answers = asyncio.run(run())
    assert len(answers) == 8
    assert all(a.debiased and a.profile.name == "async" and 0 <= a.index < 3 for a in answers)
