"""Every stock retrieval component of issue 39 against a live `lad serve` (demo model, a
profile calibrated with ``"n": "all"``, a retrieve token), with its own defaults, in both
scenarios (8 candidate images, 2), and each one's error path: the component's ranking is
right and of the length it asks for, and a 4xx reaches its caller with the service's
message. The drivers are in tests/ecosystem.py (``python -m tests.ecosystem`` prints the
matrix)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.ecosystem import (
    COMPONENTS,
    DEFAULT_TOP,
    NEEDS_A_FIX,
    SCENARIOS,
    SILENT_ERRORS,
    Service,
    calibration_body,
    data_url,
    scenario_item,
)
from tests.live import LiveService

pytestmark = pytest.mark.slow

TOKEN = "ecosystem-test-token"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    workdir = tmp_path_factory.mktemp("ecosystem")
    with LiveService(workdir, env={"LAD_RETRIEVE_TOKEN": TOKEN}) as live:
        r = httpx.post(f"{live.url}/v1/calibrate", json=calibration_body(), timeout=600)
        assert r.status_code == 200, r.text
        assert [row["n"] for row in r.json()["per_n"]] == list(range(2, 9))
        model = httpx.get(f"{live.url}/v1/models").json()["data"][0]["id"]
        yield Service(live.url, TOKEN, model)


@pytest.mark.parametrize("n", SCENARIOS.values(), ids=list(SCENARIOS))
@pytest.mark.parametrize("name", COMPONENTS)
def test_component_with_its_defaults(service: Service, name: str, n: int) -> None:
    item = scenario_item(n)
    documents = [data_url(im) for im in item.images]
    drive = COMPONENTS[name]
    if name in NEEDS_A_FIX:  # fails, and its message says what to change
        with pytest.raises(Exception) as refused:
            drive(service, item.query, documents)
        assert NEEDS_A_FIX[name] in str(refused.value), str(refused.value)[-2000:]
        return
    ranking = drive(service, item.query, documents)
    assert len(ranking) == min(DEFAULT_TOP.get(name, n), n)
    assert len(set(ranking)) == len(ranking) and all(0 <= i < n for i in ranking)
    assert ranking[0] == item.target  # the demo model finds it in any order (SCENARIO_ITEMS)


@pytest.mark.parametrize(
    ("kind", "message"),
    [("not an image", "documents[1] is not a readable image"), ("blank query", "query is empty")],
)
@pytest.mark.parametrize("name", COMPONENTS)
def test_component_sees_the_services_error(
    service: Service, name: str, kind: str, message: str
) -> None:
    """A 400 (a document that is no image) and a 422 (a blank query) reach the caller with
    the service's message, through each component's own error path."""
    item = scenario_item(2)
    documents = [data_url(im) for im in item.images]
    query = item.query
    if kind == "not an image":
        documents[1] = "bm90IGFuIGltYWdl"  # base64 of "not an image"
    else:
        query = " "
    if name in NEEDS_A_FIX:
        message = NEEDS_A_FIX[name] if kind == "not an image" else message
    with pytest.raises(Exception) as failed:
        COMPONENTS[name](service, query, documents)
    if name in SILENT_ERRORS:
        assert isinstance(failed.value, KeyError) and failed.value.args == ("results",)
    elif name == "infinity_client" and kind == "not an image":
        # its generated client types a 422 only; any other status returns None
        assert "returned nothing" in str(failed.value)
    else:
        assert message in str(failed.value), str(failed.value)[-2000:]
