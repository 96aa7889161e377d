"""The store contract every backend honours, and its errors.

Semantics shared by all backends:
- `put` never overwrites: it stores an immutable new version (last allocated + 1),
  stamps `created_at`, makes it current atomically and keeps the last K versions
  (the current one is never trimmed).
- `get` answers from the replica's in-memory copy, so a request never waits on
  the backend; only admin operations (`versions`, `get_version`) may hit it.
- `put_many` does what `put` does for several keys at once, all or none: after a failure
  (or a crash and restart) either every profile has its new version current or none has.
- `rollback` moves the current pointer to the newest kept version older than the
  current one (or to an explicit kept version); versions are not deleted by it.
- `delete` removes every version of a key; a later `put` continues after the highest
  version ever allocated for it (a high-water mark survives delete), so a version number
  never names two different calibrations.
- `health()["writes"]` says whether the store takes writes ("ok", "failing", "unknown"):
  the outcome of its latest write, a real one or the tiny probe `check_writes` makes when
  none was recorded lately (a store that reads fine may refuse every write: a full disk, a
  read-only mount, Redis at maxmemory with noeviction or refusing writes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, runtime_checkable

from calibration_store.profile import Profile, ProfileKey

DEFAULT_KEEP_VERSIONS = 5
WRITE_PROBE_EVERY_S: Final = 5.0
"""`check_writes` probes only when no write outcome was recorded for this long."""


class StoreError(Exception):
    """Base class of the store's errors (each subclass is one cause)."""


class StoreUnavailable(StoreError):
    """The backend cannot be reached or written (Redis down, disk error)."""


class StoreCorrupt(StoreError):
    """A stored document cannot be read back (bad JSON, invalid fields, an unknown schema):
    a fault of the store's content, not of the request."""


class ProfileNotFound(StoreError):
    """No profile (or no such version) under this key."""


class NoPreviousVersion(StoreError):
    """Rollback asked for, but no older version is kept for this key."""


@runtime_checkable
class ProfileStore(Protocol):
    """What the service needs from a calibration store (see module docstring)."""

    keep_versions: int

    def get(self, key: ProfileKey) -> Profile | None: ...
    def put(self, profile: Profile) -> Profile: ...
    def put_many(self, profiles: Sequence[Profile]) -> list[Profile]: ...
    def versions(self, key: ProfileKey) -> list[int]: ...
    def get_version(self, key: ProfileKey, version: int) -> Profile | None: ...
    def list_keys(self, model_id: str | None = None) -> list[ProfileKey]: ...
    def delete(self, key: ProfileKey) -> bool: ...
    def rollback(self, key: ProfileKey, to_version: int | None = None) -> Profile: ...
    def health(self) -> dict[str, Any]: ...
    def check_writes(self, force: bool = False) -> bool | None: ...
    def close(self) -> None: ...


class WriteHealth:
    """The outcome of a store's latest write (see module docstring), thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failing: bool | None = None  # None: nothing written or probed yet
        self.last_error: str | None = None
        self._at = float("-inf")

    def record(self, error: BaseException | None) -> None:
        with self._lock:
            self.failing = error is not None
            self.last_error = None if error is None else one_line(error)
            self._at = time.monotonic()

    def probe(self, write: Callable[[], Any], force: bool = False) -> bool | None:
        """Run ``write`` (tiny, leaving nothing behind) unless an outcome was recorded in the
        last WRITE_PROBE_EVERY_S (``force``: run it anyway, as before an admin write);
        record and return its outcome (None: not due, nothing ran)."""
        with self._lock:
            if not force and time.monotonic() - self._at < WRITE_PROBE_EVERY_S:
                return None
            self._at = time.monotonic()  # one probe at a time, however many readiness calls
        try:
            write()
        except Exception as exc:  # whatever the backend raises: the write failed
            self.record(exc)
            return False
        self.record(None)
        return True

    def state(self) -> str:
        return "unknown" if self.failing is None else "failing" if self.failing else "ok"


def sorted_keys(keys: Any, model_id: str | None) -> list[ProfileKey]:
    """Filter by model and order keys stably (model, name, labels, N)."""
    chosen = [k for k in keys if model_id is None or k.model_id == model_id]
    return sorted(chosen, key=lambda k: (k.model_id, k.name, k.label_scheme, k.n))


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An error's text for one log line (pydantic's span many)."""
    return " | ".join(str(exc).split("\n"))[:limit]


def check_keep_versions(keep_versions: int) -> int:
    if keep_versions < 1:
        raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
    return keep_versions


def check_distinct(profiles: Sequence[Profile]) -> list[ProfileKey]:
    """The keys of a `put_many`: at least one profile, one per key."""
    keys = [p.key for p in profiles]
    if not keys or len(set(keys)) != len(keys):
        raise ValueError("put_many takes one or more profiles with distinct keys")
    return keys
