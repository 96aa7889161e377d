"""Evidence writes off the request path: a retrieval never waits on the online store.

A retrieval keeps its evidence for feedback (DESIGN §2.8) by handing it to this bounded
queue and answering at once; one background task writes the queue to the store in order.
When the store is slow the queue fills and new evidence is dropped (``queue_full``); when a
write fails the evidence is dropped (``store_error``) and so is every write offered or still
queued for ``EVIDENCE_PAUSE_S`` (``paused``): a store that is down costs the writer one
timeout per pause, not one per request. Each drop is counted in
``lad_store_writes_dropped_total{reason}`` and remembered (the last ``LOST_KEPT`` request
ids, with the store's reason), so feedback for such a request answers 503 with that reason
instead of 404 ``request_not_found``.

Feedback sent just after its retrieval waits (at most ``SETTLE_S``) for that request's
write, so the queue never turns a prompt feedback into a 404 on this replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict

from starlette.concurrency import run_in_threadpool

from app.observability.metrics import Metrics
from calibration_store import Evidence, OnlineStore, StoreError

log = logging.getLogger(__name__)

EVIDENCE_QUEUE = 1024
"""Most evidence writes waiting; an offer past it is dropped (``queue_full``)."""
EVIDENCE_PAUSE_S = 5.0
"""After a failed write, offers are dropped (``paused``) this long, then tried again."""
LOST_KEPT = 4096
"""Most dropped request ids remembered with their reason (the oldest forgotten first)."""
SETTLE_S = 5.0
"""Longest a feedback waits for its retrieval's queued write."""
WARN_EVERY_S = 10.0
"""At most one warning per reason this often: a slow store must not flood the log."""


class EvidenceWrites:
    """The bounded queue of evidence writes and the task that writes it (module docstring).
    Lives on the service's event loop; the task starts with the first offer."""

    def __init__(self, online: OnlineStore, metrics: Metrics) -> None:
        self.online = online
        self.dropped = metrics.store_writes_dropped
        self._queue: asyncio.Queue[tuple[str, Evidence, asyncio.Event]] = asyncio.Queue(
            EVIDENCE_QUEUE
        )
        self._pending: dict[str, asyncio.Event] = {}
        self._lost: OrderedDict[str, str] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._paused_until = 0.0
        self._pause_reason = ""
        self._warned: dict[str, float] = {}

    def offer(self, request_id: str, evidence: Evidence) -> None:
        """Queue one write without waiting; drop it (counted, remembered) when the store
        failed lately or the queue is full."""
        if time.monotonic() < self._paused_until:
            self._drop("paused", request_id, self._pause_reason)
            return
        done = asyncio.Event()
        try:
            self._queue.put_nowait((request_id, evidence, done))
        except asyncio.QueueFull:
            self._drop(
                "queue_full",
                request_id,
                f"the calibration store is slow: {EVIDENCE_QUEUE} evidence writes are waiting",
            )
            return
        self._pending[request_id] = done
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._write_all())

    async def settled(self, request_id: str, timeout_s: float = SETTLE_S) -> None:
        """Wait until this request's queued write is done (at most ``timeout_s``)."""
        done = self._pending.get(request_id)
        if done is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout_s)

    def lost(self, request_id: str) -> str | None:
        """Why this request's evidence was not kept (None: not dropped here)."""
        return self._lost.get(request_id)

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    async def close(self, timeout_s: float = 2.0) -> None:
        """Let the queue drain for at most ``timeout_s``, then stop the task."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout_s)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def _write_all(self) -> None:
        while True:
            request_id, evidence, done = await self._queue.get()
            try:
                if time.monotonic() < self._paused_until:  # queued before the failure
                    self._drop("paused", request_id, self._pause_reason)
                    continue
                await run_in_threadpool(self.online.put_evidence, request_id, evidence)
            except StoreError as exc:
                self._paused_until = time.monotonic() + EVIDENCE_PAUSE_S
                self._pause_reason = f"the calibration store did not take it ({exc})"
                self._drop("store_error", request_id, self._pause_reason)
            except Exception:  # the writer outlives any one write
                log.exception("evidence of request %s not kept", request_id)
            finally:
                done.set()
                if self._pending.get(request_id) is done:  # a client may reuse an id
                    del self._pending[request_id]
                self._queue.task_done()

    def _drop(self, reason: str, request_id: str, why: str) -> None:
        self.dropped.labels(reason=reason).inc()
        self._lost[request_id] = why
        self._lost.move_to_end(request_id)
        while len(self._lost) > LOST_KEPT:
            self._lost.popitem(last=False)
        now = time.monotonic()
        if now - self._warned.get(reason, float("-inf")) >= WARN_EVERY_S:
            self._warned[reason] = now
            log.warning("evidence not kept (%s): %s", reason, why)
