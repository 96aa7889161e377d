"""The replica's in-flight byte budget (issues 29, 41): one account per request, bodies
within ``capacity - headroom``, growth (pixels, answers) within ``capacity``; waiters in
order, 429 with Retry-After after the wait, 413 for what can never fit; the total never
above the capacity, whatever the arrival order."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app import errors
from app.budget import Account, ByteBudget


def test_a_reservation_waits_for_room_and_is_refused_after_its_wait() -> None:
    budget = ByteBudget(100)
    assert budget.reserve(60, "a", kind="growth") == 60
    with pytest.raises(errors.Overloaded) as refused:
        budget.reserve(60, "b", kind="growth", wait_s=0.1)
    assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "2"
    assert "LAD_MAX_INFLIGHT_BYTES=100" in refused.value.message
    released: list[float] = []

    def release_later() -> None:
        time.sleep(0.2)
        released.append(time.monotonic())
        budget.release(60)

    threading.Thread(target=release_later).start()
    assert budget.reserve(60, "c", kind="growth", wait_s=5) == 60
    assert time.monotonic() >= released[0]  # it waited for the release
    assert budget.used == 60 and budget.peak == 60


def test_what_can_never_fit_is_refused_at_once_not_admitted_over_the_capacity() -> None:
    budget = ByteBudget(100, headroom=40)
    start = time.monotonic()
    with pytest.raises(errors.PayloadTooLarge, match="at most 60"):
        budget.reserve(61, "a body", kind="entry")
    with pytest.raises(errors.ImageTooLarge, match="at most 100"):
        budget.reserve(101, "pixels", kind="growth")
    assert time.monotonic() - start < 0.05 and budget.used == 0 and budget.peak == 0


def test_bodies_leave_the_headroom_to_growth() -> None:
    """Bodies fill at most capacity - headroom: the pixels of an admitted request fit."""
    budget = ByteBudget(100, headroom=40)
    assert budget.reserve(60, "body a", kind="entry") == 60
    with pytest.raises(errors.Overloaded):
        budget.reserve(1, "body b", kind="entry", wait_s=0.05)
    assert budget.reserve(40, "pixels of a", kind="growth", wait_s=0.05) == 40
    assert budget.used == 100 == budget.peak


def test_waiters_are_served_in_order_on_the_event_loop() -> None:
    budget = ByteBudget(100)
    order: list[str] = []

    async def one(name: str, n: int) -> None:
        held = await budget.areserve(n, name, kind="entry", wait_s=5)
        order.append(name)
        await asyncio.sleep(0.05)
        budget.release(held)

    async def main() -> None:
        budget.reserve(100, "first", kind="entry")
        tasks = [asyncio.create_task(one(name, 80)) for name in ("b", "c", "d")]
        await asyncio.sleep(0.05)
        budget.release(100)
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert order == ["b", "c", "d"] and budget.used == 0 and budget.peak == 100


def test_a_small_reservation_passes_a_large_one_that_waits() -> None:
    budget = ByteBudget(1600)
    budget.reserve(1000, "first", kind="growth")
    refused: list[bool] = []

    def big() -> None:
        try:
            budget.reserve(1000, "big", kind="growth", wait_s=0.5)
        except errors.Overloaded:
            refused.append(True)

    waiting = threading.Thread(target=big)
    waiting.start()
    time.sleep(0.05)
    start = time.monotonic()
    assert budget.reserve(100, "small", kind="growth", wait_s=5) == 100  # 1/16: passes
    assert time.monotonic() - start < 0.3
    waiting.join()
    assert refused == [True]  # the big one still waits its turn, then 429


def test_an_account_gives_back_everything_it_holds_once() -> None:
    budget = ByteBudget(100, headroom=40)
    account = Account(budget)
    asyncio.run(account.admit(50, "body"))
    held = account.grow(30, "pixels")
    account.close()
    account.give_back(held)  # a late give-back after close: nothing twice
    assert budget.used == 0 and account.held == 0


def test_requests_holding_bodies_all_get_their_pixels_in_turn() -> None:
    """Four requests each hold a body and then ask for pixels: the headroom lets them run
    one after another; the total never passes the capacity (the old rule let each run
    "alone" beside the others' bodies, so that the total passed it)."""
    budget = ByteBudget(100, headroom=40)
    bodies_held = threading.Barrier(4)
    done: list[str] = []

    def request(name: str) -> None:
        account = Account(budget)
        account.held += budget.reserve(15, f"{name} body", kind="entry", wait_s=5)
        try:
            bodies_held.wait(5)  # every body held before any pixels are asked for
            pixels = account.grow(40, f"{name} pixels")
            assert budget.used <= budget.capacity
            time.sleep(0.05)
            account.give_back(pixels)
            done.append(name)
        finally:
            account.close()

    start = time.monotonic()
    threads = [threading.Thread(target=request, args=(n,)) for n in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(done) == list("abcd") and time.monotonic() - start < 2
    assert budget.used == 0 and budget.peak <= budget.capacity == 100


CAPACITY, HEADROOM = 1000, 250

request_shapes = st.lists(
    st.tuples(
        st.integers(1, CAPACITY - HEADROOM),  # the body
        st.lists(st.integers(1, HEADROOM), max_size=3),  # its decodes, one after another
        st.integers(0, HEADROOM),  # how much its answer is larger than its body
        st.floats(0, 0.004),  # when it arrives
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None)
@given(shapes=request_shapes, seed=st.integers(0, 2**16))
def test_the_total_never_passes_the_capacity_whatever_the_arrival_order(
    shapes: list[tuple[int, list[int], int, float]], seed: int
) -> None:
    """Requests of random sizes arriving in random orders, each as the service runs one:
    its body admitted on the event loop, its pixels charged on a thread (one decode at a
    time), its answer topped up to its size. Every request finishes (nothing waits forever
    for another) and ``used`` is never above the capacity."""
    budget = ByteBudget(CAPACITY, headroom=HEADROOM)
    seen: list[int] = []
    rng = random.Random(seed)

    def decodes(account: Account, sizes: list[int]) -> None:
        for n in sizes:
            held = account.grow(n, "pixels")
            seen.append(budget.used)
            time.sleep(rng.random() * 0.002)
            account.give_back(held)

    async def request(body: int, sizes: list[int], answer: int, at: float) -> None:
        await asyncio.sleep(at)
        account = Account(budget)
        try:
            await account.admit(body, "body")
            seen.append(budget.used)
            await asyncio.to_thread(decodes, account, sizes)
            if answer:
                await account.agrow(answer, "the answer")
            seen.append(budget.used)
            await asyncio.sleep(rng.random() * 0.002)
        finally:
            account.close()

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(request(*s) for s in shapes)), 20)

    asyncio.run(main())
    assert max(seen) <= CAPACITY and budget.peak <= CAPACITY and budget.used == 0
