"""Redis store shared by every replica: versioned immutable keys + an atomic current pointer.

Layout under a prefix P, with E = the URL-quoted key segments "model:name:labels:n":
    P:profile:E:v{version}   the profile JSON (immutable once written)
    P:versions:E             sorted set of the kept versions
    P:current:E              hash {version, rev}: the pointer every replica serves
    P:counter:E              the last version allocated: the high-water mark (kept on delete)
    P:keys                   set of every E
    P:seq                    global change sequence; each change gets a fresh `rev`
    P:epoch                  a random name for this Redis's data, set by the first replica
                             that finds none: a new one means Redis lost everything
A change (put, rollback, delete) is one Lua script, so pointer swap, trimming to
the last K versions and the pub/sub message on P:profiles:changed are atomic. A put
allocates its version inside that script (optimistically: it reads the counter, builds the
document for counter + 1, and the script commits only if the counter is still there, else
the put retries), so a put that fails or times out never burns a version, and a delete
between a put's read and its commit cannot make versions restart: the counter survives
delete and versions of a key only ever increase.

Each replica serves `get` from an in-memory copy kept fresh three ways, because
pub/sub drops messages while a subscriber is disconnected: a listener thread
reloads a key when its message arrives; every (re)subscription triggers a full
re-read; and a periodic poll re-reads everything. Each cached state is stamped with the
change sequence it is known as of (a change's `rev`, or a snapshot's `seq`) and replaced
only by one known as of a later-or-equal point: a slow reload never undoes a newer change,
and a key that vanished for a moment is picked up again by the next read. Versions are
never reused, even by a Redis that restarted empty or went back to an older backup (the
epoch, replica high-water marks): docs/store-consistency.md.

Degraded, not down: when Redis cannot be reached at start-up the store still opens (empty
copy, reported not ok) and the listener keeps reconnecting in the background; while Redis
is away `get` serves the copy and every call that needs Redis fails fast (no client-side
retries, `socket_timeout`) with StoreUnavailable.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any
from urllib.parse import quote, unquote

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from calibration_store.base import (
    DEFAULT_KEEP_VERSIONS,
    NoPreviousVersion,
    ProfileNotFound,
    StoreCorrupt,
    StoreUnavailable,
    WriteHealth,
    check_distinct,
    check_keep_versions,
    one_line,
    sorted_keys,
)
from calibration_store.profile import Profile, ProfileKey
from calibration_store.redis_listener import ChangeListener
from calibration_store.redis_scripts import COMMIT, DELETE, RAISE, ROLLBACK, SNAPSHOT

log = logging.getLogger(__name__)

_PUT_ATTEMPTS = 20


def encode_key(key: ProfileKey) -> str:
    """model:name:labels:n with every segment quoted, so ':' inside a segment stays unambiguous."""
    parts = (key.model_id, key.name, key.label_scheme, str(key.n))
    return ":".join(quote(p, safe="") for p in parts)


def decode_key(encoded: str) -> ProfileKey:
    model_id, name, labels, n = (unquote(p) for p in encoded.split(":"))
    return ProfileKey(model_id=model_id, name=name, label_scheme=labels, n=int(n))


class RedisProfileStore:
    """Profiles in Redis, served from a per-replica in-memory copy (see module docstring)."""

    backend = "redis"

    def __init__(
        self,
        url: str,
        *,
        keep_versions: int = DEFAULT_KEEP_VERSIONS,
        key_prefix: str = "lad",
        poll_interval: float = 5.0,
        socket_timeout: float = 2.0,
        reconnect_delay: float = 0.5,
        listen: bool = True,
    ) -> None:
        self.keep_versions = check_keep_versions(keep_versions)
        self.prefix = key_prefix
        self.channel = f"{key_prefix}:profiles:changed"
        self.poll_interval = poll_interval
        self.reconnect_delay = reconnect_delay
        self.instance_id = uuid.uuid4().hex[:12]
        self._client = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            health_check_interval=30,
            retry=Retry(NoBackoff(), 0),  # fail fast: the caller answers 503, not a stall
            client_name=f"lad-store-{self.instance_id}",
        )
        self._commit = self._client.register_script(COMMIT)
        self._rollback = self._client.register_script(ROLLBACK)
        self._delete = self._client.register_script(DELETE)
        self._snapshot = self._client.register_script(SNAPSHOT)
        self._raise = self._client.register_script(RAISE)
        self._cache: dict[ProfileKey, Profile] = {}
        self._revs: dict[ProfileKey, int] = {}  # the change sequence each state is known as of
        self._high: dict[ProfileKey, int] = {}  # highest version seen (kept on delete and loss)
        self._lock = threading.RLock()
        self._load_lock = threading.Lock()  # snapshots apply in the order they were read
        self._epoch: str | None = None
        self._seq_seen = 0
        self.store_resets = 0  # times Redis was found emptied or rewound
        self.writes = WriteHealth()
        self._errors: dict[str, str] = {}  # encoded key -> why its document was skipped
        self._connected = False
        self._last_sync: float | None = None
        self._last_error: str | None = None
        self._listener = ChangeListener(
            self._client,
            self.channel,
            self.instance_id,
            sync=self.sync,
            reload=self._reload,
            lost=self._lost,
            poll_interval=poll_interval,
            reconnect_delay=reconnect_delay,
        )
        try:
            self.sync()
        except StoreUnavailable as exc:  # start degraded; the listener keeps reconnecting
            log.warning(
                "profile store: Redis is unreachable at start-up (%s); serving an "
                "empty copy and reconnecting in the background",
                exc,
            )
        if listen:
            self.start_listener()

    # ------------------------------------------------------------ helpers
    def _k(self, kind: str, encoded: str) -> str:
        return f"{self.prefix}:{kind}:{encoded}"

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except RedisError as exc:
            if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
                self._connected = False  # not for a refusal (OOM, READONLY): Redis is there
            self._last_error = f"{what}: {exc}"
            raise StoreUnavailable(f"redis {what} failed: {exc}") from exc

    def _write(self, what: str, fn: Callable[[], Any]) -> Any:
        """A call that writes: its outcome is what readiness says about writes."""
        try:
            out = self._call(what, fn)
        except StoreUnavailable as exc:
            self.writes.record(exc)
            raise
        self.writes.record(None)
        return out

    def _apply(self, key: ProfileKey, at: int, profile: Profile | None) -> None:
        """Install a key's state as of change sequence ``at`` unless a later one is there."""
        with self._lock:
            if at < self._revs.get(key, -1):
                return
            self._revs[key] = at
            if profile is None:
                self._cache.pop(key, None)
            else:
                self._cache[key] = profile
                self._seen(key, profile.version)

    def _seen(self, key: ProfileKey, version: int) -> None:
        with self._lock:
            self._high[key] = max(self._high.get(key, 0), version)

    def _parse(self, encoded: str, doc: str) -> Profile | None:
        try:
            profile = Profile.from_json(doc)
        except ValueError as exc:  # e.g. a newer replica wrote an unknown schema_version
            self._errors[encoded] = str(exc)
            log.warning("skipping profile %s: %s", encoded, exc)
            return None
        self._errors.pop(encoded, None)
        return profile

    def _load(self, encoded: list[str] | None) -> None:
        """Re-read the given keys (None = all) atomically and reconcile the cache: every state
        read is known as of the snapshot's `seq`."""
        args = [self.prefix, *(encoded or [])]
        names = [f"{self.prefix}:seq", f"{self.prefix}:keys", f"{self.prefix}:epoch"]
        with self._load_lock:
            out = self._snapshot(keys=names, args=args)
            seq = int(out[0])
            self._check_epoch(out[1] or self._claim_epoch(), seq)
            seen: set[ProfileKey] = set()
            for i in range(2, len(out), 3):
                key = decode_key(out[i])
                seen.add(key)  # an unreadable or missing document keeps the copy we serve
                self._seen(key, int(out[i + 2]))
                if not out[i + 1]:
                    self._errors[out[i]] = "document missing behind its current pointer"
                    log.warning("profile %s: document missing (evicted?)", out[i])
                    continue
                profile = self._parse(out[i], out[i + 1])
                if profile is not None:
                    self._apply(key, seq, profile)
            with self._lock:
                scope = list(self._cache) if encoded is None else [decode_key(e) for e in encoded]
            for key in scope:
                if key not in seen:  # gone at `seq`: removes it unless a newer change landed
                    self._apply(key, seq, None)

    def _claim_epoch(self) -> str | None:
        """A Redis without an epoch (new, emptied, or older than epochs) gets one; the first
        replica's wins. None when Redis refuses the write (judged by `seq` alone then)."""
        name = f"{self.prefix}:epoch"
        try:
            self._client.set(name, uuid.uuid4().hex, nx=True)
            return self._client.get(name)
        except RedisError as exc:
            log.warning("profile store: cannot name the Redis epoch (%s)", exc)
            return None

    def _check_epoch(self, epoch: str | None, seq: int) -> None:
        """After Redis lost its data (a new epoch) or went back in time (its change sequence
        fell: an older backup, a failover to a lagging replica), the copy follows it and the
        high-water marks this replica saw go back into Redis."""
        lost = seq < self._seq_seen or (None not in (epoch, self._epoch) and epoch != self._epoch)
        self._epoch = epoch or self._epoch
        self._seq_seen = seq
        if not lost:
            return
        self.store_resets += 1
        log.warning(
            "profile store: Redis lost its data or was rewound (change sequence %d); "
            "serving what it holds now, versions continue above the highest seen",
            seq,
        )
        with self._lock:
            self._revs.clear()
            highs = dict(self._high)
        if highs:
            counters = [self._k("counter", encode_key(k)) for k in highs]
            try:
                self._raise(keys=counters, args=list(highs.values()))
            except RedisError as exc:  # this replica still allocates above them itself
                log.warning("profile store: cannot republish version high-water marks: %s", exc)

    def sync(self) -> None:
        """Full re-read of every profile (on start, on every (re)subscription, every poll)."""
        self._call("sync", lambda: self._load(None))
        self._connected = True
        self._last_sync = time.monotonic()

    # -------------------------------------------------------------- reads
    def get(self, key: ProfileKey) -> Profile | None:
        with self._lock:
            return self._cache.get(key)

    def list_keys(self, model_id: str | None = None) -> list[ProfileKey]:
        with self._lock:
            return sorted_keys(self._cache, model_id)

    def versions(self, key: ProfileKey) -> list[int]:
        members = self._call(
            "versions", lambda: self._client.zrange(self._k("versions", encode_key(key)), 0, -1)
        )
        return sorted(int(v) for v in members)

    def get_version(self, key: ProfileKey, version: int) -> Profile | None:
        name = self._k("profile", f"{encode_key(key)}:v{version}")
        doc = self._call("get_version", lambda: self._client.get(name))
        if doc is None:
            return None
        try:
            return Profile.from_json(doc)
        except ValueError as exc:  # bad JSON, invalid fields, or an unknown schema_version
            raise StoreCorrupt(f"document {name} cannot be read: {one_line(exc)}") from exc

    # ---------------------------------------------------------- mutations
    def put(self, profile: Profile) -> Profile:
        return self.put_many([profile])[0]

    def put_many(self, profiles: Sequence[Profile]) -> list[Profile]:
        """A new version of every profile: each counter + 1, allocated and committed in one
        script, all or none (the script checks every counter before its first write)."""
        keys = check_distinct(profiles)
        encs = [encode_key(k) for k in keys]
        counters = [self._k("counter", enc) for enc in encs]
        for _ in range(_PUT_ATTEMPTS):
            lasts = self._call("put", partial(self._client.mget, counters))
            with self._lock:  # above what Redis counts and what this replica ever saw
                nexts = [
                    max(int(last or 0), self._high.get(k, 0)) + 1
                    for k, last in zip(keys, lasts, strict=True)
                ]
            stored = [p.stored_as(v) for p, v in zip(profiles, nexts, strict=True)]
            script_keys = [f"{self.prefix}:seq", f"{self.prefix}:keys"]
            args: list[Any] = [len(stored), self.keep_versions, self.channel, self.instance_id]
            for enc, counter, s in zip(encs, counters, stored, strict=True):
                script_keys += [
                    self._k("current", enc),
                    self._k("versions", enc),
                    self._k("profile", f"{enc}:v{s.version}"),
                    counter,
                ]
                args += [enc, s.version, s.to_json(), self._k("profile", f"{enc}:v")]
            out = self._write("put", partial(self._commit, keys=script_keys, args=args))
            if int(out[0]) == -1:  # another put took a version first: read the counters again
                continue
            rev, stale = int(out[0]), []
            if rev < self._seq_seen:  # the change sequence went back: Redis lost data
                self._call("put", partial(self._load, None))
            for i, (key, s) in enumerate(zip(keys, stored, strict=True)):
                self._seen(key, s.version)
                if int(out[2 + 2 * i]) == s.version:
                    self._apply(key, rev, s)
                else:  # a concurrent, newer put won the pointer; serve whatever is current
                    stale.append(encs[i])
            if stale:
                self._call("put", partial(self._load, stale))
            return stored
        raise StoreUnavailable(f"{keys[0]}: {_PUT_ATTEMPTS} concurrent puts kept winning")

    def rollback(self, key: ProfileKey, to_version: int | None = None) -> Profile:
        enc = encode_key(key)
        keys = [f"{self.prefix}:seq", self._k("current", enc), self._k("versions", enc)]
        args = [enc, to_version or 0, self.channel, self.instance_id]
        target, rev = self._write("rollback", lambda: self._rollback(keys=keys, args=args))
        if target == -1:
            raise ProfileNotFound(f"no profile {key}")
        if target == -2:
            raise NoPreviousVersion(f"{key}: version {rev} is the oldest kept version")
        if target == -3:
            raise ProfileNotFound(f"{key}: version {to_version} is not kept")
        profile = self.get_version(key, int(target))
        if profile is None:  # trimmed by a concurrent put in between; reload what is current
            self._call("rollback", lambda: self._load([enc]))
            raise ProfileNotFound(f"{key}: version {target} vanished during rollback")
        self._apply(key, int(rev), profile)
        return profile

    def delete(self, key: ProfileKey) -> bool:
        enc = encode_key(key)
        keys = [
            f"{self.prefix}:seq",
            f"{self.prefix}:keys",
            self._k("current", enc),
            self._k("versions", enc),
        ]
        args = [enc, self._k("profile", f"{enc}:v"), self.channel, self.instance_id]
        existed, rev = self._write("delete", lambda: self._delete(keys=keys, args=args))
        if existed:
            self._apply(key, int(rev), None)
        return bool(existed)

    # ------------------------------------------------------------ listener
    def start_listener(self) -> None:
        """Start the background thread (pub/sub reloads + periodic poll)."""
        self._listener.channel, self._listener.poll_interval = self.channel, self.poll_interval
        self._listener.start()

    def stop_listener(self, timeout: float = 5.0) -> None:
        """Stop the background thread; `get` keeps serving the (now frozen) copy."""
        self._listener.stop(timeout)

    @property
    def subscriptions(self) -> int:
        return self._listener.subscriptions

    def _reload(self, encoded: str) -> None:
        self._load([encoded])
        self._last_sync = time.monotonic()

    def _lost(self, why: str) -> None:
        self._connected = False
        self._last_error = why

    # -------------------------------------------------------------- misc
    def health(self) -> dict[str, Any]:
        with self._lock:
            profiles = len(self._cache)
        age = None if self._last_sync is None else round(time.monotonic() - self._last_sync, 3)
        listening = self._listener.alive
        return {
            "backend": self.backend,
            "ok": self._connected,
            "connected": self._connected,
            "listening": listening,
            "profiles": profiles,
            "last_sync_age_s": age,
            "subscriptions": self.subscriptions,
            "last_error": self._last_error,
            "errors": dict(self._errors),
            "store_resets": self.store_resets,
            "writes": self.writes.state(),
            "last_write_error": self.writes.last_error,
            "key_prefix": self.prefix,
        }

    def check_writes(self, force: bool = False) -> bool | None:
        """A short-lived key set (what maxmemory with noeviction, a read-only replica or
        min-replicas-to-write refuse), unless a write's outcome was recorded lately."""
        name = f"{self.prefix}:probe:{self.instance_id}"
        return self.writes.probe(lambda: self._client.set(name, "1", px=30_000), force)

    def close(self) -> None:
        self.stop_listener()
        self._client.close()
