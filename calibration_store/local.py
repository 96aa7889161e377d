"""In-process stores: `memory://` (tests) and the embedded file store (the default).

Both keep every key's kept versions in memory and serve reads from there. The
file store also writes one JSON document per key, always to a temporary file
first (fsync, then os.replace), so a crash leaves either the old or the new
document, never half of one, and the store survives restarts. Writers are
serialised by a thread lock and an advisory file lock, and every mutation
re-reads the key's document first, so two processes sharing a directory never
lose a version (their in-memory copies only refresh on their own writes).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from calibration_store.base import (
    DEFAULT_KEEP_VERSIONS,
    NoPreviousVersion,
    ProfileNotFound,
    StoreUnavailable,
    WriteHealth,
    check_distinct,
    check_keep_versions,
    sorted_keys,
)
from calibration_store.profile import Profile, ProfileKey

log = logging.getLogger(__name__)

STORE_FORMAT = 1


@dataclass(frozen=True)
class _Entry:
    """All kept versions of one key, the current pointer and the last allocated version.

    A deleted key keeps its entry without versions (``current`` 0): a tombstone holding the
    high-water mark, so that versions stay strictly increasing across a delete.
    """

    current: int
    last_version: int
    versions: dict[int, Profile] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return bool(self.versions)


def _live(entry: _Entry | None) -> _Entry | None:
    return entry if entry is not None and entry.live else None


class MemoryProfileStore:
    """Versioned profiles in a dict; also the engine of the file store."""

    backend = "memory"

    def __init__(self, *, keep_versions: int = DEFAULT_KEEP_VERSIONS) -> None:
        self.keep_versions = check_keep_versions(keep_versions)
        self._entries: dict[ProfileKey, _Entry] = {}
        self._lock = threading.RLock()

    # --------------------------------------------------- persistence hooks
    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._lock:
            yield

    def _fresh(self, key: ProfileKey) -> _Entry | None:
        """The authoritative entry for a mutation (the file store re-reads disk)."""
        return self._entries.get(key)

    def _write(self, key: ProfileKey, entry: _Entry) -> None:
        """Persist an entry (a tombstone too) before it becomes visible in memory."""

    def _write_many(self, changes: dict[ProfileKey, _Entry]) -> None:
        """Persist several entries all or none (the file store keeps an undo journal)."""
        for key, entry in changes.items():
            self._write(key, entry)

    # ------------------------------------------------------------- reads
    def get(self, key: ProfileKey) -> Profile | None:
        with self._lock:
            entry = _live(self._entries.get(key))
            return entry.versions[entry.current] if entry else None

    def versions(self, key: ProfileKey) -> list[int]:
        with self._lock:
            entry = self._entries.get(key)
            return sorted(entry.versions) if entry else []

    def get_version(self, key: ProfileKey, version: int) -> Profile | None:
        with self._lock:
            entry = self._entries.get(key)
            return entry.versions.get(version) if entry else None

    def list_keys(self, model_id: str | None = None) -> list[ProfileKey]:
        with self._lock:
            return sorted_keys((k for k, e in self._entries.items() if e.live), model_id)

    # ---------------------------------------------------------- mutations
    def put(self, profile: Profile) -> Profile:
        return self.put_many([profile])[0]

    def put_many(self, profiles: Sequence[Profile]) -> list[Profile]:
        """A new version of every profile (distinct keys), made current all or none."""
        keys = check_distinct(profiles)
        stored: list[Profile] = []
        with self._exclusive():
            changes: dict[ProfileKey, _Entry] = {}
            for key, profile in zip(keys, profiles, strict=True):
                old = self._fresh(key)
                version = (old.last_version if old else 0) + 1
                stored.append(profile.stored_as(version))
                versions = {**(old.versions if old else {}), version: stored[-1]}
                kept = sorted(versions)[-self.keep_versions :]
                changes[key] = _Entry(
                    current=version, last_version=version, versions={v: versions[v] for v in kept}
                )
            self._write_many(changes)
            self._entries.update(changes)
        return stored

    def rollback(self, key: ProfileKey, to_version: int | None = None) -> Profile:
        with self._exclusive():
            entry = _live(self._fresh(key))
            if entry is None:
                raise ProfileNotFound(f"no profile {key}")
            if to_version is None:
                older = [v for v in entry.versions if v < entry.current]
                if not older:
                    raise NoPreviousVersion(
                        f"{key}: version {entry.current} is the oldest kept version"
                    )
                to_version = max(older)
            elif to_version not in entry.versions:
                raise ProfileNotFound(
                    f"{key}: version {to_version} is not kept (kept: {sorted(entry.versions)})"
                )
            target = entry.versions[to_version]
            self._commit(key, replace(entry, current=to_version))
        return target

    def delete(self, key: ProfileKey) -> bool:
        """Remove every version; the tombstone keeps the high-water mark."""
        with self._exclusive():
            entry = _live(self._fresh(key))
            if entry is None:
                return False
            self._commit(key, _Entry(current=0, last_version=entry.last_version))
        return True

    def _commit(self, key: ProfileKey, entry: _Entry) -> None:
        self._write(key, entry)
        self._entries[key] = entry

    # -------------------------------------------------------------- misc
    def health(self) -> dict[str, Any]:
        with self._lock:
            live = sum(e.live for e in self._entries.values())
            return {"backend": self.backend, "ok": True, "profiles": live, "writes": "ok"}

    def check_writes(self, force: bool = False) -> bool | None:
        """Memory always takes writes: nothing to probe."""
        return None

    def close(self) -> None:
        """Nothing to release; present for the protocol."""


def _file_name(key: ProfileKey) -> str:
    """Readable yet collision-free: model ids and label lists may hold any character."""
    canonical = json.dumps(key.model_dump(), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:20]
    return f"{key.name}--n{key.n}--{digest}.json"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write-to-temp + fsync + os.replace: readers see the old or the new bytes, never a mix."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


_UNDO_SUFFIX = ".undo"


def _read_or_none(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _restore(path: Path, doc: str | None) -> None:
    """The old document (None: none) back in place, with the version high-water mark of
    the one it replaces, so that an undone version number is never handed out again."""
    try:
        now: tuple[ProfileKey, _Entry] | None = _decode_entry(path.read_bytes())
    except FileNotFoundError:
        now = None
    except (ValueError, KeyError, TypeError):  # half-written by nobody (atomic), but be safe
        now = None
    if doc is None:
        if now is None:
            path.unlink(missing_ok=True)
        else:
            atomic_write(path, _encode_entry(now[0], _Entry(0, now[1].last_version)))
        return
    key, entry = _decode_entry(doc.encode())
    if now is not None and now[1].last_version > entry.last_version:
        entry = replace(entry, last_version=now[1].last_version)
    atomic_write(path, _encode_entry(key, entry))


def _decode_entry(data: bytes) -> tuple[ProfileKey, _Entry]:
    doc = json.loads(data)
    if doc.get("store_format") != STORE_FORMAT:
        raise ValueError(f"unknown store_format {doc.get('store_format')!r}")
    key = ProfileKey.model_validate(doc["key"])
    versions = {p.version: p for p in map(Profile.from_dict, doc["versions"])}
    entry = _Entry(
        current=int(doc["current"]), last_version=int(doc["last_version"]), versions=versions
    )
    consistent = entry.current in versions if versions else entry.current == 0
    if not consistent or any(p.key != key for p in versions.values()):
        raise ValueError("document is inconsistent (current version missing or foreign key)")
    return key, entry


def _encode_entry(key: ProfileKey, entry: _Entry) -> bytes:
    doc = {
        "store_format": STORE_FORMAT,
        "key": key.model_dump(),
        "current": entry.current,
        "last_version": entry.last_version,
        "versions": [entry.versions[v].to_dict() for v in sorted(entry.versions)],
    }
    return json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()


class FileProfileStore(MemoryProfileStore):
    """The embedded default: one JSON document per key under `root`, atomically replaced."""

    backend = "file"

    def __init__(
        self, root: str | os.PathLike[str], *, keep_versions: int = DEFAULT_KEEP_VERSIONS
    ) -> None:
        super().__init__(keep_versions=keep_versions)
        self.root = Path(root).expanduser().resolve()
        self._errors: list[str] = []
        self.writes = WriteHealth()
        self._lock_file = self._open(self.root)
        with self._exclusive():
            self._load_all()

    def _open(self, root: Path) -> BinaryIO | None:
        """The directory's lock file. A directory that can be read but not written (a
        read-only mount, a ConfigMap) opens too: its profiles are served and every write
        is refused (``writes: failing``); only one that cannot be read is unavailable."""
        try:
            root.mkdir(parents=True, exist_ok=True)
            return open(root / ".lock", "a+b")
        except OSError as exc:
            if not (root.is_dir() and os.access(root, os.R_OK | os.X_OK)):
                raise StoreUnavailable(f"cannot open profile directory {root}: {exc}") from exc
            log.warning("profile directory %s is read-only (%s): serving what it holds", root, exc)
            self.writes.record(exc)
        try:  # flock needs no write access: writers elsewhere are still excluded
            return open(root / ".lock", "rb")
        except OSError:
            return None

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._lock:
            if self._lock_file is None:  # read-only without a lock file: nobody writes here
                yield
                return
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)

    def _load_all(self) -> None:
        """Read every document; leftovers of crashed writes are removed, a multi-key write
        that did not finish is undone, bad files reported."""
        for tmp in self.root.glob(".*.tmp"):
            with contextlib.suppress(OSError):  # a read-only directory keeps them
                tmp.unlink(missing_ok=True)
        for journal in sorted(self.root.glob(f"*{_UNDO_SUFFIX}")):
            self._undo(journal)
        for path in sorted(self.root.glob("*.json")):
            try:
                key, entry = _decode_entry(path.read_bytes())
            except (OSError, ValueError, KeyError, TypeError) as exc:
                msg = f"{path.name}: {exc}"
                log.warning("skipping unreadable profile document %s", msg)
                self._errors.append(msg)
                continue
            self._entries[key] = entry

    def _fresh(self, key: ProfileKey) -> _Entry | None:
        path = self.root / _file_name(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreUnavailable(f"cannot read {path}: {exc}") from exc
        return _decode_entry(data)[1]

    def _write(self, key: ProfileKey, entry: _Entry) -> None:
        path = self.root / _file_name(key)
        try:
            atomic_write(path, _encode_entry(key, entry))
        except OSError as exc:
            self.writes.record(exc)
            raise StoreUnavailable(f"cannot write {path}: {exc}") from exc
        self.writes.record(None)

    def _write_many(self, changes: dict[ProfileKey, _Entry]) -> None:
        """All or none across several documents: the old bytes of every document go to an
        undo journal first (fsync'ed); then each document is replaced; then the journal is
        removed. A failure on the way restores the old documents at once, a crash on the
        way restores them at the next open, so a reader after recovery sees all of the
        new versions or none of them."""
        if len(changes) <= 1:
            super()._write_many(changes)
            return
        names = [_file_name(key) for key in changes]
        try:
            old = {name: _read_or_none(self.root / name) for name in names}
            journal = self.root / f"batch-{uuid.uuid4().hex}{_UNDO_SUFFIX}"
            atomic_write(journal, json.dumps(old, separators=(",", ":")).encode())
        except OSError as exc:
            self.writes.record(exc)
            raise StoreUnavailable(f"cannot write the undo journal in {self.root}: {exc}") from exc
        try:
            super()._write_many(changes)
        except BaseException:
            self._undo(journal)
            raise
        try:
            journal.unlink()
        except OSError as exc:  # all written; the journal would undo it at the next open
            self._undo(journal)
            raise StoreUnavailable(f"cannot remove the undo journal {journal}: {exc}") from exc

    def _undo(self, journal: Path) -> None:
        """Put back the documents an undo journal names (keeping the high-water marks the
        undone write reached); a journal that cannot be applied stays for the next open
        (and is reported)."""
        try:
            old: dict[str, str | None] = json.loads(journal.read_bytes())
            for name, doc in old.items():
                _restore(self.root / Path(name).name, doc)
            journal.unlink()
            _fsync_dir(self.root)
        except (OSError, ValueError, AttributeError) as exc:
            msg = f"{journal.name}: cannot undo an unfinished multi-profile write: {exc}"
            log.error("%s", msg)
            self._errors.append(msg)

    def check_writes(self, force: bool = False) -> bool | None:
        """A one-byte file created and removed in the directory (what a full disk or a
        read-only mount refuses), unless a write's outcome was recorded lately."""

        def probe() -> None:
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".probe.", suffix=".tmp")
            try:
                os.write(fd, b"1")
            finally:
                os.close(fd)
                os.unlink(tmp)

        return self.writes.probe(probe, force)

    def health(self) -> dict[str, Any]:
        with self._lock:
            live = sum(e.live for e in self._entries.values())
            return {
                "backend": self.backend,
                "ok": True,
                "profiles": live,
                "path": str(self.root),
                "errors": list(self._errors),
                "writes": self.writes.state(),
                "last_write_error": self.writes.last_error,
            }

    def close(self) -> None:
        with self._lock:
            if self._lock_file is not None and not self._lock_file.closed:
                self._lock_file.close()
