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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from calibration_store.profile import Profile, ProfileKey

DEFAULT_KEEP_VERSIONS = 5


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
    def close(self) -> None: ...


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
