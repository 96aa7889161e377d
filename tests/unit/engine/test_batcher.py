"""The dynamic batcher on its own: no model, plain functions as handlers."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from app.engine.batcher import Batcher, BatcherStopped, QueueFull


def _run(coro):
    return asyncio.run(coro)


async def _submit(batcher: Batcher, item: int) -> int:
    """One item through ``submit_many`` (the batcher's one way in), awaited."""
    (future,) = batcher.submit_many([item])
    return await future


class Recorder:
    """Handler that doubles numbers and records batch sizes and the thread it ran on."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[int] = set()
        self.delay_s = delay_s

    def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        self.threads.add(threading.get_ident())
        if self.delay_s:
            time.sleep(self.delay_s)
        return [2 * x for x in items]


def test_results_match_items_and_batches_form() -> None:
    handler = Recorder(delay_s=0.02)
    batcher = Batcher(handler, max_batch_size=4, max_wait_ms=20, max_queue=64)
    batcher.start()

    async def go() -> list[int]:
        return await asyncio.gather(*(_submit(batcher, i) for i in range(10)))

    try:
        assert _run(go()) == [2 * i for i in range(10)]
    finally:
        batcher.stop()
    assert all(len(b) <= 4 for b in handler.batches)
    assert sum(len(b) for b in handler.batches) == 10
    assert max(len(b) for b in handler.batches) > 1  # concurrent items were batched
    assert len(handler.threads) == 1  # one worker thread owns the handler


def test_max_batch_size_one_never_batches() -> None:
    handler = Recorder()
    batcher = Batcher(handler, max_batch_size=1, max_wait_ms=50, max_queue=64)
    batcher.start()

    async def go() -> list[int]:
        return await asyncio.gather(*(_submit(batcher, i) for i in range(6)))

    try:
        assert _run(go()) == [0, 2, 4, 6, 8, 10]
    finally:
        batcher.stop()
    assert [len(b) for b in handler.batches] == [1] * 6


def test_single_item_waits_no_longer_than_max_wait() -> None:
    batcher = Batcher(Recorder(), max_batch_size=32, max_wait_ms=30, max_queue=8)
    batcher.start()
    try:
        t0 = time.perf_counter()
        assert _run(_submit(batcher, 21)) == 42
        assert time.perf_counter() - t0 < 1.0
    finally:
        batcher.stop()


def test_full_queue_raises_queue_full_with_retry_after() -> None:
    release = threading.Event()

    def slow(items: list[int]) -> list[int]:
        release.wait(5)
        return items

    batcher = Batcher(slow, max_batch_size=1, max_wait_ms=0, max_queue=2)
    batcher.start()

    async def go() -> QueueFull:
        first = asyncio.ensure_future(_submit(batcher, 0))  # taken by the worker, blocks
        await asyncio.sleep(0.05)
        queued = [asyncio.ensure_future(_submit(batcher, i)) for i in (1, 2)]  # fill the queue
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull) as info:
            await _submit(batcher, 3)
        release.set()
        assert await first == 0
        assert await asyncio.gather(*queued) == [1, 2]
        return info.value

    try:
        err = _run(go())
    finally:
        batcher.stop()
    assert err.depth == 2
    assert err.retry_after_s >= 1


def test_failing_item_fails_alone_and_worker_survives() -> None:
    def picky(items: list[int]) -> list[int]:
        if 13 in items:
            raise ValueError("unlucky item")
        return [x + 1 for x in items]

    batcher = Batcher(picky, max_batch_size=8, max_wait_ms=30, max_queue=64)
    batcher.start()

    async def go() -> list[object]:
        return await asyncio.gather(
            *(_submit(batcher, i) for i in (1, 13, 2)), return_exceptions=True
        )

    try:
        results = _run(go())
        assert results[0] == 2 and results[2] == 3
        assert isinstance(results[1], ValueError)
        assert _run(_submit(batcher, 5)) == 6  # still serving
        assert batcher.running
    finally:
        batcher.stop()


def test_wrong_result_count_is_an_error_not_a_hang() -> None:
    batcher = Batcher(lambda items: [], max_batch_size=1, max_wait_ms=0, max_queue=4)
    batcher.start()
    try:
        with pytest.raises(RuntimeError, match="returned 0 results"):
            _run(_submit(batcher, 1))
    finally:
        batcher.stop()


def test_submit_before_start_and_after_stop() -> None:
    batcher = Batcher(Recorder(), max_batch_size=2, max_wait_ms=0, max_queue=4)
    with pytest.raises(BatcherStopped):
        _run(_submit(batcher, 1))
    batcher.start()
    assert _run(_submit(batcher, 1)) == 2
    batcher.stop()
    assert not batcher.running
    with pytest.raises(BatcherStopped):
        _run(_submit(batcher, 1))


def test_depth_counts_waiting_items() -> None:
    release = threading.Event()

    def slow(items: list[int]) -> list[int]:
        release.wait(5)
        return items

    batcher = Batcher(slow, max_batch_size=1, max_wait_ms=0, max_queue=8)
    batcher.start()

    async def go() -> int:
        futures = [asyncio.ensure_future(_submit(batcher, i)) for i in range(4)]
        await asyncio.sleep(0.1)
        depth = batcher.depth
        release.set()
        await asyncio.gather(*futures)
        return depth

    try:
        assert _run(go()) == 3  # one in the handler, three waiting
        assert batcher.depth == 0
    finally:
        batcher.stop()


def test_invalid_configuration() -> None:
    with pytest.raises(ValueError):
        Batcher(Recorder(), max_batch_size=0)
    with pytest.raises(ValueError):
        Batcher(Recorder(), max_queue=0)


# ---------------------------------------------------------------- all-or-none admission
class Gate:
    """Handler that blocks until opened, so the queue can be filled deterministically."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()
        self.items: list[int] = []
        self.delay_s = delay_s

    def __call__(self, items: list[int]) -> list[int]:
        self.entered.set()
        self.open.wait(10)
        time.sleep(self.delay_s)
        self.items += items
        return items


def test_submit_many_admits_all_or_none_and_cancelled_items_never_run() -> None:
    gate = Gate()
    batcher = Batcher(gate, max_batch_size=1, max_wait_ms=0, max_queue=6)
    batcher.start()

    async def go() -> None:
        running = batcher.submit_many([100])  # taken by the worker, which then blocks
        while not gate.entered.is_set():
            await asyncio.sleep(0.001)
        first = batcher.submit_many([1, 2, 3, 4])  # 4 of 6 places
        with pytest.raises(QueueFull) as info:
            batcher.submit_many([5, 6, 7])  # needs 3, only 2 left: none is queued
        assert info.value.needed == 3 and info.value.depth == 4
        assert batcher.depth == 4
        second = batcher.submit_many([8, 9])  # exactly fits
        for future in second:  # the caller gave up (a sibling failed, or it disconnected)
            future.cancel()
        gate.open.set()
        assert await asyncio.gather(*running, *first) == [100, 1, 2, 3, 4]

    try:
        _run(go())
        deadline = time.monotonic() + 5
        while batcher.depth and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        batcher.stop()
    assert sorted(gate.items) == [1, 2, 3, 4, 100]  # 5, 6, 7 refused; 8, 9 cancelled


def test_submit_many_larger_than_the_queue_runs_when_the_queue_is_empty() -> None:
    batcher = Batcher(Recorder(), max_batch_size=4, max_wait_ms=0, max_queue=2)
    batcher.start()

    async def go() -> list[int]:
        return list(await asyncio.gather(*batcher.submit_many(list(range(5)))))

    try:
        assert _run(go()) == [0, 2, 4, 6, 8]
    finally:
        batcher.stop()


def test_retry_after_grows_with_the_queue_and_the_measured_batch_time() -> None:
    batcher = Batcher(Recorder(), max_batch_size=2, max_wait_ms=0, max_queue=64)
    assert batcher.retry_after_s() == 1  # nothing measured yet
    batcher._mean_batch_s = 0.5  # as measured after slow batches
    assert batcher.retry_after_s(needed=1, depth=0) == 1  # (0 + 1) / 2 -> 1 batch + running
    assert batcher.retry_after_s(needed=8, depth=20) == math.ceil((14 + 1) * 0.5)
    assert batcher.retry_after_s(needed=8, depth=60) > batcher.retry_after_s(needed=8, depth=20)


class GatedRecorder(Gate):
    """Gate that also records each batch as it was formed."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []

    def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        return super().__call__(items)


def test_by_default_nothing_waits_for_company() -> None:
    assert Batcher(Recorder()).max_wait_s == 0.0
    from app.settings import Settings

    assert Settings().max_wait_ms == 0.0


def test_arrivals_during_a_batch_form_the_next_batch() -> None:
    handler = GatedRecorder()
    batcher = Batcher(handler, max_batch_size=8, max_queue=64)  # no timer
    batcher.start()

    async def go() -> list[int]:
        first = batcher.submit_many([100])  # an idle worker takes it alone, at once
        while not handler.entered.is_set():
            await asyncio.sleep(0.001)
        later = [*batcher.submit_many([1, 2, 3]), *batcher.submit_many([4])]
        handler.open.set()
        return await asyncio.gather(*first, *later)

    try:
        assert _run(go()) == [100, 1, 2, 3, 4]
    finally:
        batcher.stop()
    assert handler.batches == [[100], [1, 2, 3, 4]]


def test_a_timer_lets_a_partial_batch_wait_but_a_full_one_runs() -> None:
    handler = Recorder()
    batcher = Batcher(handler, max_batch_size=2, max_wait_ms=10_000, max_queue=8)
    batcher.start()

    async def go() -> list[int]:
        first = batcher.submit_many([1])
        await asyncio.sleep(0.05)  # the worker holds a partial batch and waits for more
        return await asyncio.gather(*first, *batcher.submit_many([2]))

    try:
        assert _run(go()) == [2, 4]
    finally:
        batcher.stop()
    assert handler.batches == [[1, 2]]  # full at 2: it ran without waiting out the timer


# ---------------------------------------------------------------- the idle hook
class IdleLog:
    """An idle hook that records when it ran, on which thread, and can fail on demand."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[float] = []
        self.threads: set[int] = set()
        self.fail = fail
        self.called = threading.Event()

    def __call__(self) -> None:
        self.calls.append(time.perf_counter())
        self.threads.add(threading.get_ident())
        self.called.set()
        if self.fail:
            raise RuntimeError("idle hook failed")


def test_on_idle_runs_once_per_idle_spell_on_the_worker_thread() -> None:
    handler, idle = Recorder(), IdleLog()
    batcher = Batcher(handler, max_queue=8, on_idle=idle, idle_after_s=0.2)
    batcher.start()
    try:
        time.sleep(0.4)
        assert idle.calls == []  # no batch has run yet: nothing to give back
        finished = time.perf_counter()
        assert _run(_submit(batcher, 1)) == 2
        assert idle.called.wait(5)
        assert idle.calls[0] - finished >= 0.2  # not before the queue stayed empty that long
        time.sleep(0.6)
        assert len(idle.calls) == 1  # once per spell, not every idle_after_s
        assert _run(_submit(batcher, 2)) == 4
        deadline = time.perf_counter() + 5
        while len(idle.calls) < 2 and time.perf_counter() < deadline:
            time.sleep(0.01)
        assert len(idle.calls) == 2  # a new batch, a new idle spell
    finally:
        batcher.stop()
    assert idle.threads == handler.threads  # the worker thread, where the model lives


def test_a_busy_queue_defers_the_idle_hook() -> None:
    idle = IdleLog()
    batcher = Batcher(Recorder(delay_s=0.05), max_queue=8, on_idle=idle, idle_after_s=0.3)
    batcher.start()
    try:
        for i in range(8):  # a batch every ~0.1 s: never 0.3 s without one
            assert _run(_submit(batcher, i)) == 2 * i
            time.sleep(0.05)
        assert idle.calls == []
        assert idle.called.wait(5)
    finally:
        batcher.stop()


def test_a_failing_idle_hook_leaves_the_worker_serving() -> None:
    idle = IdleLog(fail=True)
    batcher = Batcher(Recorder(), max_queue=8, on_idle=idle, idle_after_s=0.05)
    batcher.start()
    try:
        assert _run(_submit(batcher, 1)) == 2
        assert idle.called.wait(5)
        assert batcher.running
        assert _run(_submit(batcher, 3)) == 6
    finally:
        batcher.stop()


def test_the_idle_delay_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Batcher(Recorder(), idle_after_s=0)
