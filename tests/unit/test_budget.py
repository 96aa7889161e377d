"""The replica's in-flight byte budget (issue 29): requests wait their turn, in order, and
are refused 429 with Retry-After when the wait is too long; one larger than the budget
runs alone."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from app import errors
from app.budget import OWN_BYTES, ByteBudget


def test_a_reservation_waits_for_room_and_is_refused_after_its_wait() -> None:
    budget = ByteBudget(100)
    assert budget.reserve(60, "a") == 60
    with pytest.raises(errors.Overloaded) as refused:
        budget.reserve(60, "b", wait_s=0.1)
    assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "2"
    assert "LAD_MAX_INFLIGHT_BYTES=100" in refused.value.message
    released: list[float] = []

    def release_later() -> None:
        time.sleep(0.2)
        released.append(time.monotonic())
        budget.release(60)

    threading.Thread(target=release_later).start()
    assert budget.reserve(60, "c", wait_s=5) == 60
    assert time.monotonic() >= released[0]  # it waited for the release
    assert budget.used == 60 and budget.peak == 60


def test_a_request_larger_than_the_budget_runs_alone() -> None:
    budget = ByteBudget(100)
    assert budget.reserve(500, "huge") == 500  # nothing else held: admitted
    with pytest.raises(errors.Overloaded):
        budget.reserve(1, "small", wait_s=0.05)
    budget.release(500)
    assert budget.reserve(1, "small") == 1


def test_waiters_are_served_in_order_on_the_event_loop() -> None:
    budget = ByteBudget(100)
    order: list[str] = []

    async def one(name: str, n: int) -> None:
        held = await budget.areserve(n, name, wait_s=5)
        order.append(name)
        await asyncio.sleep(0.05)
        budget.release(held)

    async def main() -> None:
        budget.reserve(100, "first")
        tasks = [asyncio.create_task(one(name, 80)) for name in ("b", "c", "d")]
        await asyncio.sleep(0.05)
        budget.release(100)
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert order == ["b", "c", "d"] and budget.used == 0 and budget.peak == 100


def test_a_request_never_waits_for_its_own_body() -> None:
    """Its pixels beside its own body may exceed the budget (it then runs alone)."""
    budget = ByteBudget(100)
    body = budget.reserve(80, "body")
    token = OWN_BYTES.set(body)
    try:
        assert budget.reserve(90, "its pixels", wait_s=0.05) == 90
    finally:
        OWN_BYTES.reset(token)
    with pytest.raises(errors.Overloaded):  # another request's pixels wait
        budget.reserve(90, "other pixels", wait_s=0.05)


def test_a_small_reservation_passes_a_large_one_that_waits() -> None:
    budget = ByteBudget(1600)
    budget.reserve(1000, "first")
    refused: list[bool] = []

    def big() -> None:
        try:
            budget.reserve(1000, "big", wait_s=0.5)
        except errors.Overloaded:
            refused.append(True)

    waiting = threading.Thread(target=big)
    waiting.start()
    time.sleep(0.05)
    start = time.monotonic()
    assert budget.reserve(100, "small", wait_s=5) == 100  # 1/16 of the budget: passes
    assert time.monotonic() - start < 0.3
    waiting.join()
    assert refused == [True]  # the big one still waits its turn, then 429


def test_requests_larger_than_the_budget_take_turns_instead_of_waiting_for_each_other() -> None:
    """Four requests, each holding its body and asking for more pixels than the whole
    budget: each runs alone in turn. (They used to wait out BUDGET_WAIT_S for each other's
    bodies, so that four 12 x 4096² PNG retrieves at once got two 429s after 30 s.)"""
    budget = ByteBudget(100)
    bodies_held = threading.Barrier(4)
    done: list[tuple[str, float]] = []
    during: list[int] = []

    def request(name: str) -> None:
        body = budget.reserve(5, f"{name} body")
        token = OWN_BYTES.set(body)
        try:
            bodies_held.wait(5)  # every body held before any pixels are asked for
            pixels = budget.reserve(500, f"{name} pixels", wait_s=5)
            during.append(budget.used)
            time.sleep(0.05)
            budget.release(pixels)
            done.append((name, time.monotonic()))
        finally:
            OWN_BYTES.reset(token)
            budget.release(body)

    start = time.monotonic()
    threads = [threading.Thread(target=request, args=(n,)) for n in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == 4 and max(t for _, t in done) - start < 2  # no one waited out 5 s
    assert all(used <= 500 + 4 * 5 for used in during)  # one request's pixels at a time
    assert budget.used == 0


def test_an_oversized_request_still_waits_for_pixels_being_decoded() -> None:
    budget = ByteBudget(100)
    decoding = budget.reserve(50, "pixels of another request")  # not waiting: decoding
    body = budget.reserve(5, "body")
    token = OWN_BYTES.set(body)
    try:
        with pytest.raises(errors.Overloaded):
            budget.reserve(500, "huge pixels", wait_s=0.1)
    finally:
        OWN_BYTES.reset(token)
    budget.release(decoding)
