"""The Python client: typed answers from a real app (tiny model, memory store), images from
PIL / bytes / paths, errors as LadError, and the retry policy on 429 / 503."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from lad_client import (
    AsyncLadClient,
    LadClient,
    LadConnectionError,
    LadError,
    RetryPolicy,
    encode_image,
    retry_after_s,
)
from lad_client.types import CalibrateResponse, ProfileList, RetrieveResponse
from tests.api.helpers import png_bytes


def test_client_calibrates_retrieves_and_manages_profiles(
    make_client, items, calibration_items, tmp_path
):
    http = make_client(admin_token="admin-secret")
    lad = LadClient(http=http, admin_token="admin-secret")

    with pytest.raises(LadError) as missing:
        lad.retrieve(items[0].query, items[0].images, request_id="req-7")
    assert missing.value.status == 409 and missing.value.code == "calibration_required"
    assert missing.value.request_id == "req-7"

    summary = lad.calibrate([(it.query, it.images, it.target) for it in calibration_items])
    assert isinstance(summary, CalibrateResponse) and summary.version == 1 and summary.n == 3

    first, second, third = items[0].images
    path = tmp_path / "third.png"
    path.write_bytes(png_bytes(third))
    answer = lad.retrieve(items[0].query, [first, png_bytes(second), path], return_details=True)
    assert isinstance(answer, RetrieveResponse) and 0 <= answer.index < 3
    assert abs(sum(answer.probabilities) - 1) < 1e-6
    assert answer.profile is not None and answer.profile.version == 1
    assert answer.details is not None and len(answer.details.scores) == 3
    same = lad.retrieve(items[0].query, items[0].images)  # PIL only: the same pixels
    assert same.probabilities == pytest.approx(answer.probabilities)

    lad.calibrate([(it.query, it.images, it.target) for it in calibration_items])
    assert lad.rollback("default", 3).version == 1
    listed = lad.profiles()
    assert isinstance(listed, ProfileList) and listed.profiles[0].name == "default"
    assert lad.profile("default").entries[0].current_version == 1
    assert lad.delete("default", 3).deleted is True
    with pytest.raises(LadError):
        lad.retrieve(items[0].query, items[0].images)
    assert lad.ready().ready is True


def test_client_without_admin_token_is_refused(make_client, calibration_items):
    http = make_client(admin_token="admin-secret")
    lad = LadClient(http=http, retries=0)
    with pytest.raises(LadError) as refused:
        lad.calibrate([(it.query, it.images, it.target) for it in calibration_items])
    assert refused.value.status == 401 and refused.value.code == "unauthorized"


# ---------------------------------------------------------------------------- retries
def _flaky(answers: list[tuple[int, dict[str, str]]], seen: list[float]):
    """A transport answering ``answers`` in turn (status, headers), then 200 with a list."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(time.monotonic())
        if answers:
            status, headers = answers.pop(0)
            body = {
                "error": {"code": "overloaded" if status == 429 else "not_ready", "message": "busy"}
            }
            return httpx.Response(status, json=body, headers=headers)
        return httpx.Response(200, json={"model": "m", "profiles": []})

    return handle


def test_sync_client_retries_429_and_503_honouring_retry_after():
    seen: list[float] = []
    transport = httpx.MockTransport(_flaky([(429, {"Retry-After": "1"}), (503, {})], seen))
    http = httpx.Client(base_url="http://lad", transport=transport)
    lad = LadClient(http=http, retries=3, backoff_s=0.01)
    assert lad.profiles().model == "m"
    assert len(seen) == 3
    assert seen[1] - seen[0] >= 1.0  # waited for Retry-After, not the 10 ms backoff
    assert seen[2] - seen[1] < 0.5


def test_retries_give_up_with_the_last_error():
    seen: list[float] = []
    transport = httpx.MockTransport(_flaky([(503, {})] * 5, seen))
    lad = LadClient(
        http=httpx.Client(base_url="http://lad", transport=transport), retries=2, backoff_s=0.001
    )
    with pytest.raises(LadError) as failed:
        lad.profiles()
    assert failed.value.status == 503 and len(seen) == 3


def test_other_errors_are_not_retried():
    seen: list[float] = []
    transport = httpx.MockTransport(_flaky([(404, {})], seen))
    lad = LadClient(http=httpx.Client(base_url="http://lad", transport=transport))
    with pytest.raises(LadError) as failed:
        lad.profiles()
    assert failed.value.status == 404 and len(seen) == 1


def test_async_client_retries_too():
    seen: list[float] = []
    transport = httpx.MockTransport(_flaky([(429, {"Retry-After": "0"}), (429, {})], seen))

    async def run() -> str:
        http = httpx.AsyncClient(base_url="http://lad", transport=transport)
        async with AsyncLadClient(http=http, backoff_s=0.01) as lad:
            return (await lad.profiles()).model

    assert asyncio.run(run()) == "m" and len(seen) == 3


def test_refused_connections_are_retried_then_raised_as_a_lad_error():
    lad = LadClient("http://127.0.0.1:9", retries=1, backoff_s=0.01, timeout=2)
    with pytest.raises(LadConnectionError) as raised:
        lad.profiles()
    error = raised.value
    assert isinstance(error, LadError) and error.status == 0 and error.code == "connection_failed"
    assert isinstance(error.__cause__, httpx.ConnectError) and "/v1/profiles" in error.message


def test_a_timeout_is_a_lad_error_and_is_not_sent_again():
    seen = []

    def slow(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        raise httpx.ReadTimeout("no answer", request=request)

    http = httpx.Client(base_url="http://lad", transport=httpx.MockTransport(slow))
    with pytest.raises(LadConnectionError) as raised:
        LadClient(http=http, retries=3, backoff_s=0.01).profiles()
    assert raised.value.code == "timeout" and len(seen) == 1  # a POST may have run: no retry

    async def run() -> None:
        http = httpx.AsyncClient(base_url="http://lad", transport=httpx.MockTransport(slow))
        async with AsyncLadClient(http=http) as lad:
            await lad.profiles()

    with pytest.raises(LadConnectionError):
        asyncio.run(run())


def test_images_are_bytes_paths_or_pil_images(tmp_path):
    import base64

    from PIL import Image

    raw = png_bytes(Image.new("RGB", (2, 2), "blue"))
    (tmp_path / "a.png").write_bytes(raw)
    assert encode_image(raw) == encode_image(str(tmp_path / "a.png"))
    assert encode_image(tmp_path / "a.png") == base64.b64encode(raw).decode()
    decoded = base64.b64decode(encode_image(Image.new("RGB", (3, 2), "red")))
    assert decoded.startswith(b"\x89PNG")
    with pytest.raises(TypeError, match="not int"):
        encode_image(3)  # type: ignore[arg-type]


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after_s(httpx.Response(429, headers={"Retry-After": "7"})) == 7
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))
    assert 55 < retry_after_s(httpx.Response(503, headers={"Retry-After": date})) <= 60
    assert retry_after_s(httpx.Response(503)) is None
    policy = RetryPolicy(retries=3, base_s=0.5, max_wait_s=4)
    assert policy.wait_s(0, None) < 0.56 and policy.wait_s(0, 3) >= 3
    assert policy.wait_s(10, None) <= 4


def test_client_reranks_and_calibrates_every_n(live_server):
    """LadClient and AsyncLadClient against a running server: calibrate n="all", rerank."""
    from lad_client.types import RerankResponse
    from lad_lab.demo.world import make_items

    server = live_server()
    wide = make_items(2, n_candidates=4, setting="random", seed="calibration", image_size=56)
    many = make_items(1, n_candidates=9, setting="random", seed="eval", image_size=56)[0]
    lad = LadClient(server.url)
    summary = lad.calibrate([(it.query, it.images, it.target) for it in wide], n="all")
    assert [e.n for e in summary.per_n or []] == [2, 3, 4]
    ranked = lad.rerank(many.query, many.images, top_n=2, seed=5)
    assert isinstance(ranked, RerankResponse) and len(ranked.results) == 2
    assert ranked.meta.window == 4 and ranked.meta.method == "agd" and ranked.meta.seed == 5
    assert ranked.meta.forward_passes == sum(len(r) for r in ranked.meta.windows)

    async def run() -> RerankResponse:
        async with AsyncLadClient(server.url) as alad:
            return await alad.rerank(many.query, many.images, top_n=2, seed=5)

    assert asyncio.run(run()).results == ranked.results  # same seed, same ranking
    everything = lad.rerank(many.query, many.images, method="vanilla", window=3)
    assert sorted(r.index for r in everything.results) == list(range(9))


def test_the_route_table_is_what_the_app_serves(make_client):
    """lad_client.routes (method, path, token), which the clients send by: every route is in
    the served document with its method, and exactly the admin ones refuse the retrieve token."""
    from lad_client import ROUTES

    http = make_client(admin_token="admin-secret", retrieve_token="user-secret")
    paths = http.get("/openapi.json").json()["paths"]
    user = {"Authorization": "Bearer user-secret"}
    for route in ROUTES:
        assert route.method.lower() in paths[route.path], route.name
        answer = http.request(route.method, route.path.format(name="default"), headers=user)
        refused = answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"
        assert refused == (route.auth == "admin"), (route.name, answer.status_code)


NO_PILLOW = r"""
import sys
sys.modules["PIL"] = None  # import PIL now fails, as where Pillow is not installed
import httpx
import lad_client
from lad_client import LadClient, LadError, encode_image

def answer(request):
    return httpx.Response(409, json={"error": {"code": "calibration_required",
                          "message": "calibrate first", "request_id": "r1"}})

http = httpx.Client(base_url="http://lad", transport=httpx.MockTransport(answer))
try:
    LadClient(http=http, retries=0).retrieve("q", [b"a", b"b"])
except LadError as error:
    print(error.code, encode_image(b"ab"), lad_client.__version__)
"""


def test_the_client_sends_bytes_without_pillow():
    import subprocess
    import sys
    from pathlib import Path

    import lad_client

    done = subprocess.run(
        [sys.executable, "-c", NO_PILLOW],
        cwd=Path(lad_client.__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["calibration_required", "YWI=", lad_client.__version__]
