"""The replica's in-flight byte budget (LAD_MAX_INFLIGHT_BYTES): what all requests being
handled may hold together, so that concurrency cannot multiply the per-request bounds.

Every bound before it was per request: three concurrent 57 MB retrieves, each within its
own limits, peaked at +464 MiB above idle. A request reserves its cost before it holds
it (its body before the body is read, its images' decoded pixels before they are
decoded) and gives it back when it is done; one that would cross the budget waits its
turn (first come, first served; one of at most 1/16 of the budget passes when it fits),
and after ``BUDGET_WAIT_S`` is refused 429
``overloaded`` with ``Retry-After``. A request larger than the whole budget runs alone:
beside nothing but its own body and the bodies of requests that wait their turn here or for
a decode slot (they cannot grow until it is done, and waiting for them would have them all
wait for each other).
Thread-safe: the body is reserved on the event loop, the pixels on the decode threads.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from app import errors

BUDGET_WAIT_S = 30.0
"""Longest wait for room in the budget before 429 (the client retries after Retry-After):
LAD_READ_TIMEOUT_S's default, the time a body may take to arrive anyway."""
BODY_COPIES = 3
"""A body is charged three times its size: the bytes as received, the strings parsed from
them, and the image bytes decoded from those strings, all held until the decode ends."""
SMALL_SHARE = 16
"""A reservation of at most 1/16 of the budget passes those waiting when it fits."""
PIXEL_BYTES = 4
"""Bytes per decoded pixel charged (RGBA, the widest mode the decoder holds)."""


def _wait(wait_s: float | None) -> float:
    return BUDGET_WAIT_S if wait_s is None else wait_s


OWN_BYTES: ContextVar[int] = ContextVar("lad_budget_own_bytes", default=0)
"""Bytes the current request holds already (its body): its pixels may then run "alone"
beside them, so that a request never waits for itself."""


class ByteBudget:
    """Bytes reserved by the requests in flight, within ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition()
        self._queue: deque[int] = deque()  # tickets waiting, in arrival order
        self._tickets = itertools.count()
        self._parked = 0  # bytes held by the requests waiting here (their own bytes)

    def _room(self, n: int, own: int, parked: bool) -> bool:
        """Within the budget, or alone: every byte held is held by a request that waits
        here (``parked``: this one's own bytes are counted among them already)."""
        waiting = self._parked if parked else self._parked + own
        return self.used + n <= self.capacity or self.used - waiting <= 0

    def _fits(self, ticket: int, n: int, own: int) -> bool:
        """In turn, or small enough to pass the queue (an ordinary request's pixels must
        not wait 10 s behind a maximal body that waits for room)."""
        small = n <= self.capacity // SMALL_SHARE
        return (small or self._queue[0] == ticket) and self._room(n, own, parked=True)

    def reserve(self, n: int, what: str, wait_s: float | None = None) -> int:
        """Block until ``n`` bytes fit (a thread's call); 429 after ``wait_s``. Returns
        the bytes to ``release``."""
        if n <= 0:
            return 0
        deadline, own = time.monotonic() + _wait(wait_s), OWN_BYTES.get()
        with self._cond:
            ticket = next(self._tickets)
            self._queue.append(ticket)
            self._parked += own
            try:
                while not self._fits(ticket, n, own):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._refusal(n, what)
                    self._cond.wait(min(left, 0.05))
                self.used += n
                self.peak = max(self.peak, self.used)
            finally:
                self._queue.remove(ticket)
                self._parked -= own
                self._cond.notify_all()
        return n

    async def areserve(self, n: int, what: str, wait_s: float | None = None) -> int:
        """``reserve`` for the event loop: waits without holding a thread."""
        if n <= 0:
            return 0
        own = OWN_BYTES.get()
        with self._cond:
            small = n <= self.capacity // SMALL_SHARE
            if (small or not self._queue) and self._room(n, own, parked=False):
                self.used += n
                self.peak = max(self.peak, self.used)
                return n
            ticket = next(self._tickets)
            self._queue.append(ticket)
            self._parked += own
        deadline = time.monotonic() + _wait(wait_s)
        delay = 0.002
        try:
            while True:
                with self._cond:
                    if self._fits(ticket, n, own):
                        self.used += n
                        self.peak = max(self.peak, self.used)
                        return n
                if time.monotonic() >= deadline:
                    raise self._refusal(n, what)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.05)
        finally:
            with self._cond:
                self._queue.remove(ticket)
                self._parked -= own
                self._cond.notify_all()

    @contextmanager
    def waiting(self, own: int) -> Iterator[None]:
        """While the current request waits for its turn elsewhere (a decode slot), its own
        bytes count among those of the requests waiting here: it cannot grow until its
        turn comes, so a request larger than the budget may run alone beside it."""
        with self._cond:
            self._parked += own
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._parked -= own
                self._cond.notify_all()

    def release(self, n: int) -> None:
        if n <= 0:
            return
        with self._cond:
            self.used -= n
            self._cond.notify_all()

    def _refusal(self, n: int, what: str) -> errors.Overloaded:
        return errors.Overloaded(
            f"{what} needs {n} bytes of the replica's in-flight budget and "
            f"{self.used} of LAD_MAX_INFLIGHT_BYTES={self.capacity} are held; retry in 2 s",
            retry_after_s=2,
        )
