"""The store contract every backend honours, its errors, and change notifications.

Semantics shared by all backends:
- `put` never overwrites: it stores an immutable new version (last allocated + 1),
  stamps `created_at`, makes it current atomically and keeps the last K versions
  (the current one is never trimmed).
- `get` answers from the replica's in-memory copy, so a request never waits on
  the backend; only admin operations (`versions`, `get_version`) may hit it.
- `rollback` moves the current pointer to the newest kept version older than the
  current one (or to an explicit kept version); versions are not deleted by it.
- `delete` removes every version of a key; a later `put` starts again at 1.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from calibration_store.profile import Profile, ProfileKey

log = logging.getLogger(__name__)

DEFAULT_KEEP_VERSIONS = 5


class StoreError(Exception):
    """Base class of the store's errors (each subclass is one cause)."""


class StoreUnavailable(StoreError):
    """The backend cannot be reached or written (Redis down, disk error)."""


class ProfileNotFound(StoreError):
    """No profile (or no such version) under this key."""


class NoPreviousVersion(StoreError):
    """Rollback asked for, but no older version is kept for this key."""


@dataclass(frozen=True)
class ProfileChange:
    """The current profile of `key` changed; `profile` is None when it was deleted."""

    key: ProfileKey
    profile: Profile | None


ChangeCallback = Callable[[ProfileChange], None]


@runtime_checkable
class ProfileStore(Protocol):
    """What the service needs from a calibration store (see module docstring)."""

    keep_versions: int

    def get(self, key: ProfileKey) -> Profile | None: ...
    def put(self, profile: Profile) -> Profile: ...
    def versions(self, key: ProfileKey) -> list[int]: ...
    def get_version(self, key: ProfileKey, version: int) -> Profile | None: ...
    def list_keys(self, model_id: str | None = None) -> list[ProfileKey]: ...
    def delete(self, key: ProfileKey) -> bool: ...
    def rollback(self, key: ProfileKey, to_version: int | None = None) -> Profile: ...
    def health(self) -> dict[str, Any]: ...
    def subscribe(self, callback: ChangeCallback) -> Callable[[], None]: ...
    def close(self) -> None: ...


class ChangeNotifier:
    """Fan-out of ProfileChange events to subscribers; a failing callback never breaks a store."""

    def __init__(self) -> None:
        self._callbacks: list[ChangeCallback] = []
        self._lock = threading.Lock()

    def subscribe(self, callback: ChangeCallback) -> Callable[[], None]:
        """Register `callback`; returns a function that unregisters it."""
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unsubscribe

    def emit(self, key: ProfileKey, profile: Profile | None) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        change = ProfileChange(key=key, profile=profile)
        for cb in callbacks:
            try:
                cb(change)
            except Exception:
                log.exception("profile change callback %r failed", cb)


def sorted_keys(keys: Any, model_id: str | None) -> list[ProfileKey]:
    """Filter by model and order keys stably (model, name, labels, N)."""
    chosen = [k for k in keys if model_id is None or k.model_id == model_id]
    return sorted(chosen, key=lambda k: (k.model_id, k.name, k.label_scheme, k.n))


def check_keep_versions(keep_versions: int) -> int:
    if keep_versions < 1:
        raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
    return keep_versions
