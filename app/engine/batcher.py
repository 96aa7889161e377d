"""Adaptive batcher: one worker thread, one bounded queue, batches formed by what is waiting.

Generic on purpose (it knows nothing about images or models): callers `submit_many(items)`
from any event loop and await the futures; the worker thread calls `handler(items) ->
results` (one result per item, same order) and resolves each caller's future. The handler
runs only on the worker thread, so whatever it owns (a model) is never touched concurrently.

Batches form without a timer: an idle worker starts the first item at once, together with
whatever else is already queued (up to `max_batch_size`); items that arrive while a batch
runs wait in the queue and become the next batch. So at low load nobody waits for company
that never comes, and under load the batches grow by themselves. `max_wait_ms` (0 by
default) only lets a partial batch wait that much longer for more items, for accelerators
that want fuller batches.

A batch whose handler raises is re-run one item at a time, so a poisoned item fails only
its own caller; the worker thread never dies on a handler error.

`on_idle`, when given, runs on the worker thread once the queue has stayed empty for
`idle_after_s` after a batch (once per idle spell: the model worker gives the memory its
forwards kept back to the OS there, `app.engine.host_memory`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_STOP = object()
log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The bounded queue has no room for `needed` items: retry after `retry_after_s` seconds."""

    def __init__(self, depth: int, retry_after_s: int, needed: int = 1) -> None:
        super().__init__(
            f"queue full ({depth} waiting, {needed} needed); retry after {retry_after_s} s"
        )
        self.depth = depth
        self.retry_after_s = retry_after_s
        self.needed = needed


class BatcherStopped(Exception):
    """The batcher is not running (not started yet, or stopped with the item still queued)."""


@dataclass(eq=False)
class _Pending(Generic[T]):
    item: T
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


def _resolve(pending: _Pending, result: object, error: BaseException | None) -> None:
    """Set the caller's future on its own loop (thread-safe); skip callers that went away."""

    def _set() -> None:
        if pending.future.done():  # cancelled: the client disconnected
            return
        if error is not None:
            pending.future.set_exception(error)
        else:
            pending.future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed
        pending.loop.call_soon_threadsafe(_set)


class Batcher(Generic[T, R]):
    """Bounded queue + single worker thread that calls `handler` on dynamic batches."""

    def __init__(
        self,
        handler: Callable[[list[T]], list[R]],
        *,
        max_batch_size: int = 8,
        max_wait_ms: float = 0.0,
        max_queue: int = 64,
        name: str = "batcher",
        on_idle: Callable[[], object] | None = None,
        idle_after_s: float = 1.0,
    ) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0 or idle_after_s <= 0:
            raise ValueError(
                "max_batch_size and max_queue must be >= 1, max_wait_ms >= 0, idle_after_s > 0"
            )
        self.handler = handler
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.name = name
        self.on_idle = on_idle
        self.idle_after_s = idle_after_s
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._mean_batch_s = 0.0  # EWMA of handler time, for Retry-After
        self.batches_run = 0
        self.dropped = 0  # cancelled items taken off the queue before any forward

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def depth(self) -> int:
        """Items waiting in the queue (not counting the batch being run)."""
        return self._queue.qsize()

    def start(self) -> None:
        if self.running:
            return
        self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Let the running batch finish, fail what is still queued, and join the worker."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(_STOP)  # blocks at most until the worker takes one item
        thread.join(timeout)
        while True:
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                break
            if pending is not _STOP:
                _resolve(pending, None, BatcherStopped("the service is shutting down"))

    # ------------------------------------------------------------------ submit

    def retry_after_s(self, needed: int = 1, depth: int | None = None) -> int:
        """Seconds until the queue has likely room for `needed` items: the batches ahead
        (queued items + the one running) times the measured mean batch time; at least 1."""
        depth = self.depth if depth is None else depth
        batches = math.ceil((depth + needed) / self.max_batch_size) + 1
        return max(1, math.ceil(batches * self._mean_batch_s))

    def submit_many(self, items: Sequence[T]) -> list[asyncio.Future]:
        """Admit all `items` or none: queue them in one step when there is room for all
        (or the queue is empty), else raise QueueFull. Returns one future per item; the
        caller awaits them and cancels the rest when one fails (a cancelled item is skipped
        by the worker, so a refused or abandoned request costs no forward pass)."""
        if not self.running:
            raise BatcherStopped("the batcher is not running")
        loop = asyncio.get_running_loop()
        pending = [_Pending(item=it, future=loop.create_future(), loop=loop) for it in items]
        q = self._queue
        with q.not_full:  # the queue's own lock: no put or get interleaves
            depth = q._qsize()
            if depth and depth + len(pending) > self.max_queue:
                retry = self.retry_after_s(len(pending), depth)
                raise QueueFull(depth, retry, len(pending))
            for p in pending:
                q._put(p)
                q.unfinished_tasks += 1
            q.not_empty.notify(len(pending))
        for p in pending:
            p.future.add_done_callback(lambda future, p=p: self._drop(p, future))
        return [p.future for p in pending]

    def _drop(self, pending: _Pending, future: asyncio.Future) -> None:
        """A cancelled item leaves the queue at once (its caller went away): it neither
        waits for the worker to skip it nor holds a place that a live request needs."""
        if not future.cancelled():
            return
        q = self._queue
        with q.mutex:
            for i, queued in enumerate(q.queue):
                if queued is pending:
                    del q.queue[i]
                    q.unfinished_tasks -= 1
                    q.not_full.notify()
                    self.dropped += 1
                    return

    # ------------------------------------------------------------------ worker

    def _collect(self, first: _Pending) -> tuple[list[_Pending], bool]:
        """First item plus everything already queued, up to max_batch_size; never blocks
        unless ``max_wait_ms`` > 0, and then at most that long after the queue ran dry."""
        batch = [first]
        deadline: float | None = None
        while len(batch) < self.max_batch_size:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                if self.max_wait_s <= 0:
                    break
                if deadline is None:
                    deadline = time.perf_counter() + self.max_wait_s
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                try:
                    nxt = self._queue.get(timeout=remaining)
                except queue.Empty:
                    break
            if nxt is _STOP:
                return batch, True
            batch.append(nxt)
        return batch, False

    def _work(self) -> None:
        stop = False
        idle_due = False  # a batch ran since on_idle last did
        while not stop:
            try:
                first = self._queue.get(timeout=self.idle_after_s if idle_due else None)
            except queue.Empty:
                idle_due = False
                self._idle()
                continue
            if first is _STOP:
                break
            batch, stop = self._collect(first)
            batch = [p for p in batch if not p.future.done()]
            if batch:
                self._run(batch)
                idle_due = self.on_idle is not None

    def _idle(self) -> None:
        assert self.on_idle is not None
        try:
            self.on_idle()
        except Exception:  # the worker outlives its idle hook
            log.exception("%s: the idle hook failed", self.name)

    def _run(self, batch: list[_Pending]) -> None:
        started = time.perf_counter()
        try:
            results = self._call([p.item for p in batch])
        except Exception as exc:
            if len(batch) == 1:
                _resolve(batch[0], None, exc)
            else:  # isolate the failing item(s): re-run one at a time
                for pending in batch:
                    try:
                        _resolve(pending, self._call([pending.item])[0], None)
                    except Exception as single_exc:
                        _resolve(pending, None, single_exc)
        else:
            for pending, result in zip(batch, results, strict=True):
                _resolve(pending, result, None)
        elapsed = time.perf_counter() - started
        self._mean_batch_s = (
            elapsed if not self.batches_run else (0.8 * self._mean_batch_s + 0.2 * elapsed)
        )
        self.batches_run += 1

    def _call(self, items: list[T]) -> list[R]:
        results = list(self.handler(items))
        if len(results) != len(items):
            raise RuntimeError(
                f"batch handler returned {len(results)} results for {len(items)} items"
            )
        return results
