"""The thread that keeps a Redis store replica's in-memory copy fresh (``redis_store``):
pub/sub messages reload one key, every (re)subscription and a periodic poll re-read all.

Pub/sub drops messages while a subscriber is disconnected, hence the re-read on every
subscription (redis-py resubscribes after a reconnect) and the poll.

A lost link is retried with exponential backoff and jitter (redis-py's
``EqualJitterBackoff``: ``reconnect_delay`` doubled per failure up to ``RECONNECT_CAP_S``,
each wait drawn from its upper half), one warning per attempt: a wrong password or a
Redis that is gone for long costs a connection and a log line every ``RECONNECT_CAP_S`` at
most, not every ``reconnect_delay``. The first message or poll that succeeds resets it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import EqualJitterBackoff
from redis.exceptions import RedisError

from calibration_store.base import StoreUnavailable

log = logging.getLogger(__name__)

RECONNECT_CAP_S = 30.0
"""Longest wait between two reconnection attempts."""


class ChangeListener:
    """Subscribes to ``channel`` and calls ``sync()`` (re-read all) or ``reload(key)``
    (one encoded key, for a change another replica made); ``lost(why)`` on a broken link."""

    def __init__(
        self,
        client: redis.Redis,
        channel: str,
        origin: str,
        *,
        sync: Callable[[], None],
        reload: Callable[[str], None],
        lost: Callable[[str], None],
        poll_interval: float,
        reconnect_delay: float,
    ) -> None:
        self.client, self.channel, self.origin = client, channel, origin
        self.sync, self.reload, self.lost = sync, reload, lost
        self.poll_interval, self.reconnect_delay = poll_interval, reconnect_delay
        self.subscriptions = 0
        self.failures = 0  # attempts failed in a row (the backoff's exponent)
        self.backoff = EqualJitterBackoff(cap=RECONNECT_CAP_S, base=reconnect_delay)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.alive:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"lad-store-{self.origin}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        pubsub = None
        next_poll = time.monotonic() + self.poll_interval
        while not self._stop.is_set():
            try:
                if pubsub is None:
                    pubsub = self.client.pubsub()
                    pubsub.subscribe(self.channel)
                msg = pubsub.get_message(timeout=0.25)
                if msg is not None:
                    self._on_message(msg)
                    self.failures = 0
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + self.poll_interval
                    self.sync()
                    self.failures = 0
            except (RedisError, StoreUnavailable, OSError) as exc:
                self.lost(f"listener: {exc}")
                delay = self._next_delay()
                log.warning(
                    "profile store listener lost Redis (%s); reconnecting in %.1f s (attempt %d)",
                    exc,
                    delay,
                    self.failures,
                )
                if pubsub is not None:
                    _close(pubsub)
                    pubsub = None
                self._stop.wait(delay)
            except Exception:  # never let the thread die silently
                log.exception("profile store listener error")
                self._stop.wait(self._next_delay())
        if pubsub is not None:
            _close(pubsub)

    def _next_delay(self) -> float:
        """The wait before the next attempt: exponential in the failures in a row, jittered."""
        self.failures += 1
        return float(self.backoff.compute(self.failures - 1))

    def _on_message(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "subscribe":  # first subscription or redis-py's auto-resubscribe
            self.subscriptions += 1
            self.sync()
            return
        if msg["type"] != "message":
            return
        try:
            event = json.loads(msg["data"])
            encoded = str(event["key"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring malformed profile change message %r", msg["data"])
            return
        if event.get("origin") != self.origin:
            self.reload(encoded)


def _close(pubsub: Any) -> None:
    try:
        pubsub.close()
    except (RedisError, OSError):
        log.debug("closing the pub/sub connection failed", exc_info=True)
