"""Redis store shared by every replica: versioned immutable keys + an atomic current pointer.

Layout under a prefix P, with E = the URL-quoted key segments "model:name:labels:n":
    P:profile:E:v{version}   the profile JSON (immutable once written)
    P:versions:E             sorted set of the kept versions
    P:current:E              hash {version, rev}: the pointer every replica serves
    P:counter:E              version allocator (INCR)
    P:keys                   set of every E
    P:seq                    global change sequence; each change gets a fresh `rev`
A change (put, rollback, delete) is one Lua script, so pointer swap, trimming to
the last K versions and the pub/sub message on P:profiles:changed are atomic.

Each replica serves `get` from an in-memory copy kept fresh three ways, because
pub/sub drops messages while a subscriber is disconnected: a listener thread
reloads a key when its message arrives; every (re)subscription triggers a full
re-read; and a periodic poll re-reads everything. A cached entry is replaced only
by one with a newer-or-equal `rev`, so a slow reload never undoes a newer change.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

import redis
from redis.exceptions import RedisError

from calibration_store.base import (
    DEFAULT_KEEP_VERSIONS,
    NoPreviousVersion,
    ProfileNotFound,
    StoreUnavailable,
    check_keep_versions,
    sorted_keys,
)
from calibration_store.profile import Profile, ProfileKey

log = logging.getLogger(__name__)

_COMMIT = """
local v = tonumber(ARGV[2])
redis.call('SET', KEYS[5], ARGV[3])
local newest = redis.call('ZREVRANGE', KEYS[4], 0, 0)
redis.call('ZADD', KEYS[4], v, v)
redis.call('SADD', KEYS[2], ARGV[1])
local rev = redis.call('INCR', KEYS[1])
local cur = tonumber(redis.call('HGET', KEYS[3], 'version') or '0')
if cur == 0 or newest[1] == nil or tonumber(newest[1]) < v then
  cur = v
end
redis.call('HSET', KEYS[3], 'version', cur, 'rev', rev)
local keep = tonumber(ARGV[4])
local n = redis.call('ZCARD', KEYS[4])
if n > keep then
  for _, old in ipairs(redis.call('ZRANGE', KEYS[4], 0, n - keep - 1)) do
    if tonumber(old) ~= cur then
      redis.call('ZREM', KEYS[4], old)
      redis.call('DEL', ARGV[5] .. old)
    end
  end
end
redis.call('PUBLISH', ARGV[6], cjson.encode({op='put', key=ARGV[1], rev=rev, origin=ARGV[7]}))
return {v, rev, cur}
"""

_ROLLBACK = """
local cur = redis.call('HGET', KEYS[2], 'version')
if not cur then return {-1, 0} end
cur = tonumber(cur)
local target = tonumber(ARGV[2])
if target == 0 then
  local prev = redis.call('ZREVRANGEBYSCORE', KEYS[3], '(' .. cur, '-inf', 'LIMIT', 0, 1)
  if prev[1] == nil then return {-2, cur} end
  target = tonumber(prev[1])
elseif not redis.call('ZSCORE', KEYS[3], target) then
  return {-3, cur}
end
local rev = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], 'version', target, 'rev', rev)
redis.call('PUBLISH', ARGV[3], cjson.encode({op='rollback', key=ARGV[1], rev=rev, origin=ARGV[4]}))
return {target, rev}
"""

_DELETE = """
local existed = redis.call('SREM', KEYS[2], ARGV[1]) + redis.call('EXISTS', KEYS[3])
for _, v in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  redis.call('DEL', ARGV[2] .. v)
end
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5])
if existed == 0 then return {0, 0} end
local rev = redis.call('INCR', KEYS[1])
redis.call('PUBLISH', ARGV[3], cjson.encode({op='delete', key=ARGV[1], rev=rev, origin=ARGV[4]}))
return {1, rev}
"""

# Atomic read of the current profile of the given encoded keys (all keys when none given):
# returns {seq, E1, rev1, json1, E2, ...}; keys without a current profile are left out.
_SNAPSHOT = """
local out = {redis.call('GET', KEYS[1]) or '0'}
local p = ARGV[1]
local keys = {}
if #ARGV == 1 then keys = redis.call('SMEMBERS', KEYS[2]) else keys = {unpack(ARGV, 2)} end
for _, e in ipairs(keys) do
  local h = redis.call('HMGET', p .. ':current:' .. e, 'version', 'rev')
  if h[1] then
    local doc = redis.call('GET', p .. ':profile:' .. e .. ':v' .. h[1])
    if doc then
      table.insert(out, e); table.insert(out, h[2]); table.insert(out, doc)
    end
  end
end
return out
"""


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
            client_name=f"lad-store-{self.instance_id}",
        )
        self._commit = self._client.register_script(_COMMIT)
        self._rollback = self._client.register_script(_ROLLBACK)
        self._delete = self._client.register_script(_DELETE)
        self._snapshot = self._client.register_script(_SNAPSHOT)
        self._cache: dict[ProfileKey, Profile] = {}
        self._revs: dict[ProfileKey, int] = {}
        self._lock = threading.RLock()
        self._errors: dict[str, str] = {}  # encoded key -> why its document was skipped
        self._connected = False
        self._last_sync: float | None = None
        self._last_error: str | None = None
        self.subscriptions = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sync()  # fail fast at start-up when Redis is unreachable
        if listen:
            self.start_listener()

    # ------------------------------------------------------------ helpers
    def _k(self, kind: str, encoded: str) -> str:
        return f"{self.prefix}:{kind}:{encoded}"

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except RedisError as exc:
            self._last_error = f"{what}: {exc}"
            raise StoreUnavailable(f"redis {what} failed: {exc}") from exc

    def _apply(self, key: ProfileKey, rev: int, profile: Profile | None) -> None:
        """Install a change in the cache unless a newer one (higher rev) is already there."""
        with self._lock:
            if rev < self._revs.get(key, -1):
                return
            self._revs[key] = rev
            if profile is None:
                self._cache.pop(key, None)
            else:
                self._cache[key] = profile

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
        """Re-read the given keys (None = all) atomically and reconcile the cache."""
        args = [self.prefix, *(encoded or [])]
        out = self._snapshot(keys=[f"{self.prefix}:seq", f"{self.prefix}:keys"], args=args)
        seq = int(out[0])
        seen: set[ProfileKey] = set()
        for i in range(1, len(out), 3):
            key = decode_key(out[i])
            profile = self._parse(out[i], out[i + 2])
            seen.add(key)  # an unreadable document keeps the copy we already serve
            if profile is not None:
                self._apply(key, int(out[i + 1]), profile)
        with self._lock:
            scope = list(self._cache) if encoded is None else [decode_key(e) for e in encoded]
        for key in scope:
            if key not in seen:  # gone at `seq`: removes it unless a newer change landed
                self._apply(key, seq, None)

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
        return None if doc is None else Profile.from_json(doc)

    # ---------------------------------------------------------- mutations
    def put(self, profile: Profile) -> Profile:
        enc = encode_key(profile.key)
        version = int(self._call("put", lambda: self._client.incr(self._k("counter", enc))))
        stored = profile.stored_as(version)
        keys = [f"{self.prefix}:seq", f"{self.prefix}:keys", self._k("current", enc),
                self._k("versions", enc), self._k("profile", f"{enc}:v{version}")]
        args = [enc, version, stored.to_json(), self.keep_versions,
                self._k("profile", f"{enc}:v"), self.channel, self.instance_id]
        _, rev, current = self._call("put", lambda: self._commit(keys=keys, args=args))
        if int(current) == version:
            self._apply(profile.key, int(rev), stored)
        else:  # a concurrent, newer put won the pointer; serve whatever is current now
            self._call("put", lambda: self._load([enc]))
        return stored

    def rollback(self, key: ProfileKey, to_version: int | None = None) -> Profile:
        enc = encode_key(key)
        keys = [f"{self.prefix}:seq", self._k("current", enc), self._k("versions", enc)]
        args = [enc, to_version or 0, self.channel, self.instance_id]
        target, rev = self._call("rollback", lambda: self._rollback(keys=keys, args=args))
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
        keys = [f"{self.prefix}:seq", f"{self.prefix}:keys", self._k("current", enc),
                self._k("versions", enc), self._k("counter", enc)]
        args = [enc, self._k("profile", f"{enc}:v"), self.channel, self.instance_id]
        existed, rev = self._call("delete", lambda: self._delete(keys=keys, args=args))
        if existed:
            self._apply(key, int(rev), None)
        return bool(existed)

    # ------------------------------------------------------------ listener
    def start_listener(self) -> None:
        """Start the background thread (pub/sub reloads + periodic poll)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._listen, name=f"lad-store-{self.instance_id}", daemon=True
        )
        self._thread.start()

    def stop_listener(self, timeout: float = 5.0) -> None:
        """Stop the background thread; `get` keeps serving the (now frozen) copy."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _listen(self) -> None:
        pubsub = None
        next_poll = time.monotonic() + self.poll_interval
        while not self._stop.is_set():
            try:
                if pubsub is None:
                    pubsub = self._client.pubsub()
                    pubsub.subscribe(self.channel)
                msg = pubsub.get_message(timeout=0.25)
                if msg is not None:
                    self._on_message(msg)
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + self.poll_interval
                    self.sync()
            except (RedisError, StoreUnavailable, OSError) as exc:
                self._connected = False
                self._last_error = f"listener: {exc}"
                log.warning("profile store listener lost Redis (%s); reconnecting", exc)
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except (RedisError, OSError):
                        log.debug("closing a broken pub/sub connection failed", exc_info=True)
                    pubsub = None
                self._stop.wait(self.reconnect_delay)
            except Exception:  # never let the thread die silently
                log.exception("profile store listener error")
                self._stop.wait(self.reconnect_delay)
        if pubsub is not None:
            try:
                pubsub.close()
            except (RedisError, OSError):
                log.debug("closing the pub/sub connection failed", exc_info=True)

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
        if event.get("origin") != self.instance_id:
            self._load([encoded])
            self._last_sync = time.monotonic()

    # -------------------------------------------------------------- misc
    def health(self) -> dict[str, Any]:
        with self._lock:
            profiles = len(self._cache)
        age = None if self._last_sync is None else round(time.monotonic() - self._last_sync, 3)
        listening = self._thread is not None and self._thread.is_alive()
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
            "key_prefix": self.prefix,
        }

    def close(self) -> None:
        self.stop_listener()
        self._client.close()
