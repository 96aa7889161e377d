"""The replica's in-flight byte budget (LAD_MAX_INFLIGHT_BYTES): what all requests being
handled may hold together, so that concurrency cannot multiply the per-request bounds.

Every request has one ``Account`` in it (the body guard opens it, ``ACCOUNT`` finds it) and
everything it holds is charged there: its body (declared, or as it arrives), the pixels
being decoded, and its answer until the answer is written. ``used``, the sum of the
accounts (the ``lad_inflight_bytes`` gauge), never passes ``capacity``:

- an *entry* (a body: new work let in) is granted only within ``capacity - headroom``;
- a *growth* (pixels, an answer larger than the body: admitted work going on) may use the
  whole capacity. ``headroom`` is the most one growth needs (one image decoded at its
  largest, LAD_MAX_IMAGE_PIXELS x 4 bytes), so however many bodies are held, one growth
  always fits once the growths running end, and they wait for nothing: admitted requests
  cannot wait for each other's bodies forever (the deadlock the old "run alone" rule
  avoided by letting the total pass the capacity, so that admissions cascaded: five
  39 MB retrieves held 594 MiB of a 256 MiB budget, issue 41).

Waiters of each kind are served in arrival order; one of at most 1/16 of the budget passes
when it fits. A wait longer than ``BUDGET_WAIT_S`` is refused 429 ``overloaded`` with
``Retry-After``; a charge that can never fit (an entry over ``capacity - headroom``, a
growth over ``capacity``) is refused at once. Thread-safe: bodies are charged on the event
loop, pixels on the decode threads.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from contextvars import ContextVar
from typing import Literal

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

Kind = Literal["entry", "growth"]


def _wait(wait_s: float | None) -> float:
    return BUDGET_WAIT_S if wait_s is None else wait_s


class ByteBudget:
    """Bytes charged to the accounts of the requests in flight, within ``capacity``."""

    def __init__(self, capacity: int, headroom: int = 0) -> None:
        self.capacity = capacity
        self.headroom = max(0, min(headroom, capacity // 2))
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition()
        self._queues: dict[Kind, deque[int]] = {"entry": deque(), "growth": deque()}
        self._tickets = itertools.count()

    @property
    def entry_limit(self) -> int:
        """The most that bodies may hold together (the rest is kept for growth)."""
        return self.capacity - self.headroom

    def _limit(self, kind: Kind) -> int:
        return self.entry_limit if kind == "entry" else self.capacity

    def _fits(self, kind: Kind, n: int, ticket: int | None) -> bool:
        """In turn (or small enough to pass the queue: an ordinary request's pixels must not
        wait behind a maximal one that waits for room), and within the kind's limit."""
        queue = self._queues[kind]
        turn = n <= self.capacity // SMALL_SHARE or not queue or queue[0] == ticket
        return turn and self.used + n <= self._limit(kind)

    def _take(self, n: int) -> int:
        self.used += n
        self.peak = max(self.peak, self.used)
        return n

    def _check(self, kind: Kind, n: int, what: str) -> None:
        """Refuse at once what can never fit (413: retrying will not help, sending less will)."""
        if n > self._limit(kind):
            too_large = errors.PayloadTooLarge if kind == "entry" else errors.ImageTooLarge
            raise too_large(
                f"{what} needs {n} bytes of the replica's in-flight budget; at most "
                f"{self._limit(kind)} of LAD_MAX_INFLIGHT_BYTES={self.capacity} can be held "
                "for it"
            )

    def reserve(self, n: int, what: str, *, kind: Kind, wait_s: float | None = None) -> int:
        """Block until ``n`` bytes fit (a thread's call); 429 after ``wait_s``. Returns
        the bytes to ``release``."""
        if n <= 0:
            return 0
        self._check(kind, n, what)
        deadline = time.monotonic() + _wait(wait_s)
        with self._cond:
            if self._fits(kind, n, None):
                return self._take(n)
            ticket = next(self._tickets)
            self._queues[kind].append(ticket)
            try:
                while not self._fits(kind, n, ticket):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._refusal(n, what)
                    self._cond.wait(min(left, 0.05))
                return self._take(n)
            finally:
                self._queues[kind].remove(ticket)
                self._cond.notify_all()

    def try_reserve(self, n: int, *, kind: Kind) -> int:
        """``n`` bytes if they fit now and nobody of that kind waits, else 0 (no wait)."""
        with self._cond:
            if n > 0 and not self._queues[kind] and self.used + n <= self._limit(kind):
                return self._take(n)
        return 0

    async def areserve(self, n: int, what: str, *, kind: Kind, wait_s: float | None = None) -> int:
        """``reserve`` for the event loop: waits without holding a thread."""
        if n <= 0:
            return 0
        self._check(kind, n, what)
        with self._cond:
            if self._fits(kind, n, None):
                return self._take(n)
            ticket = next(self._tickets)
            self._queues[kind].append(ticket)
        deadline = time.monotonic() + _wait(wait_s)
        delay = 0.002
        try:
            while True:
                with self._cond:
                    if self._fits(kind, n, ticket):
                        return self._take(n)
                if time.monotonic() >= deadline:
                    raise self._refusal(n, what)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.05)
        finally:
            with self._cond:
                self._queues[kind].remove(ticket)
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


class Account:
    """What one request holds of the budget: every charge of the request goes here, and
    ``close`` gives back all of it at once (so nothing a request held outlives it)."""

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.held = 0
        self._lock = threading.Lock()

    def _add(self, n: int) -> int:
        with self._lock:
            self.held += n
        return n

    async def admit(self, n: int, what: str) -> int:
        """Charge ``n`` bytes of body (an entry), waiting for room on the event loop."""
        return self._add(await self.budget.areserve(n, what, kind="entry"))

    def grow(self, n: int, what: str) -> int:
        """Charge ``n`` more bytes for admitted work (pixels), waiting on this thread."""
        return self._add(self.budget.reserve(n, what, kind="growth"))

    def try_grow(self, n: int) -> int:
        """``n`` more bytes if they fit now, else 0."""
        return self._add(self.budget.try_reserve(n, kind="growth"))

    async def agrow(self, n: int, what: str) -> int:
        """``grow`` on the event loop (an answer larger than what the request holds)."""
        return self._add(await self.budget.areserve(n, what, kind="growth"))

    def give_back(self, n: int) -> None:
        with self._lock:
            n = min(n, self.held)
            self.held -= n
        self.budget.release(n)

    def close(self) -> None:
        self.give_back(self.held)


ACCOUNT: ContextVar[Account | None] = ContextVar("lad_budget_account", default=None)
"""The current request's account (set by the body guard; None outside a request)."""
