"""Online calibration state in Redis, shared by every replica (layout: ``evidence``).

Keys under the store's prefix P, with E the profile store's encoded key:
    P:ev:{request id}     the evidence JSON, expiring after ttl_s (PX)
    P:ev:index            sorted set request id -> time, to bound the count (oldest dropped)
    P:fbdone:{request id} the answer already counted for that id (the idempotency marker)
    P:fb:E / P:fbheld:E / P:ul:E   the feedback hash, held-out list, unlabelled hash
Each change is one Lua script, so a feedback is counted exactly once however many
replicas receive it at the same moment: the marker check, the marker, the sums and the
held-out list move together. The profile's current pointer (P:current:E, the profile
store's) is checked inside the same script: feedback for a deleted profile is refused.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from calibration_store.base import StoreCorrupt, StoreUnavailable, one_line
from calibration_store.evidence import (
    COUNTED,
    DUPLICATE,
    PROFILE_GONE,
    UNKNOWN,
    Evidence,
    FeedbackResult,
    FeedbackSnapshot,
    feedback_increments,
    snapshot_from,
    unlabelled_increments,
)
from calibration_store.profile import ProfileKey
from calibration_store.redis_store import encode_key

# KEYS evidence, index, unlabelled; ARGV json, ttl ms, now, max entries, request id,
# evidence key prefix, then field/increment pairs.
PUT = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
local now = tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], now, ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[2]) / 1000)
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if over > 0 then
  for _, old in ipairs(redis.call('ZRANGE', KEYS[2], 0, over - 1)) do
    redis.call('DEL', ARGV[6] .. old)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
end
for i = 7, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[3], ARGV[i], ARGV[i + 1]) end
return 1
"""

# KEYS evidence, marker, feedback hash, held-out list, profile current pointer;
# ARGV answer, held out (0/1), held-out record, held-out max, now, then field/increment pairs.
FEEDBACK = """
local ev = redis.call('GET', KEYS[1])
if not ev then return {'unknown', 0} end
local done = redis.call('GET', KEYS[2])
if done then return {'duplicate', tonumber(done)} end
if redis.call('EXISTS', KEYS[5]) == 0 then return {'profile_deleted', 0} end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 1 then ttl = 1 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ttl)
if ARGV[2] == '1' then
  redis.call('LPUSH', KEYS[4], ARGV[3])
  redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[4]) - 1)
  redis.call('HINCRBY', KEYS[3], 'holdout', 1)
else
  for i = 6, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[3], ARGV[i], ARGV[i + 1]) end
end
redis.call('HINCRBY', KEYS[3], 'count', 1)
redis.call('HSETNX', KEYS[3], 'first_at', ARGV[5])
redis.call('HSET', KEYS[3], 'last_at', ARGV[5])
return {'counted', redis.call('HINCRBY', KEYS[3], 'since_refresh', 1)}
"""

# KEYS feedback hash; ARGV threshold. Claims an automatic refresh once per threshold.
CLAIM = """
local n = tonumber(redis.call('HGET', KEYS[1], 'since_refresh') or '0')
if n < tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'since_refresh', 0)
return 1
"""


def _pairs(inc: dict[str, float]) -> list[str]:
    return [x for name, value in inc.items() for x in (name, repr(float(value)))]


class RedisOnlineStore:
    """The online state of one Redis (see module docstring)."""

    backend = "redis"

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "lad",
        ttl_s: float = 900.0,
        max_entries: int = 100_000,
        holdout_max: int = 1000,
        socket_timeout: float = 2.0,
    ) -> None:
        self.ttl_s, self.max_entries, self.holdout_max = ttl_s, max_entries, holdout_max
        self.prefix = key_prefix
        self._client = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._put = self._client.register_script(PUT)
        self._feedback = self._client.register_script(FEEDBACK)
        self._claim = self._client.register_script(CLAIM)

    def _k(self, kind: str, key: ProfileKey) -> str:
        return f"{self.prefix}:{kind}:{encode_key(key)}"

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RedisError as exc:
            raise StoreUnavailable(f"redis {what} failed: {exc}") from exc

    def put_evidence(self, request_id: str, evidence: Evidence) -> bool:
        keys = [
            f"{self.prefix}:ev:{request_id}",
            f"{self.prefix}:ev:index",
            self._k("ul", evidence.key),
        ]
        args = [
            evidence.to_json(),
            int(self.ttl_s * 1000),
            time.time(),
            self.max_entries,
            request_id,
            f"{self.prefix}:ev:",
            *_pairs(unlabelled_increments(evidence)),
        ]
        return bool(self._call("put evidence", self._put, keys=keys, args=args))

    def get_evidence(self, request_id: str) -> Evidence | None:
        text = self._call("get evidence", self._client.get, f"{self.prefix}:ev:{request_id}")
        return Evidence.from_json(text) if text else None

    def feedback(self, request_id: str, answer: int, profile_exists: bool) -> FeedbackResult:
        """``profile_exists`` is not trusted here: the script checks the pointer itself."""
        evidence = self.get_evidence(request_id)  # to learn which profile's keys to name
        if evidence is None:
            return FeedbackResult(UNKNOWN)
        key = evidence.key
        held = evidence.held_out  # drawn when the evidence was cached
        record = json.dumps({"s": evidence.scores, "a": evidence.attention, "t": answer})
        keys = [
            f"{self.prefix}:ev:{request_id}",
            f"{self.prefix}:fbdone:{request_id}",
            self._k("fb", key),
            self._k("fbheld", key),
            self._k("current", key),
        ]
        args = [
            answer,
            int(held),
            record,
            self.holdout_max,
            time.time(),
            *_pairs(feedback_increments(evidence, answer)),
        ]
        outcome, value = self._call("feedback", self._feedback, keys=keys, args=args)
        if outcome == COUNTED:
            return FeedbackResult(COUNTED, evidence, answer, held, int(value))
        if outcome == DUPLICATE:
            return FeedbackResult(DUPLICATE, evidence, int(value))
        return FeedbackResult(PROFILE_GONE if outcome == PROFILE_GONE else UNKNOWN, evidence)

    def snapshot(self, key: ProfileKey, layers: int) -> FeedbackSnapshot:
        pipe = self._client.pipeline(transaction=True)
        pipe.hgetall(self._k("fb", key))
        pipe.lrange(self._k("fbheld", key), 0, -1)
        pipe.hgetall(self._k("ul", key))
        fb, held, ul = self._call("snapshot", pipe.execute)
        try:
            return snapshot_from(fb, held, ul, key.n, layers)
        except (ValueError, KeyError, TypeError) as exc:  # a hand-edited or foreign hash
            raise StoreCorrupt(
                f"online statistics {self._k('fb', key)} cannot be read: {one_line(exc)}"
            ) from exc

    def claim_refresh(self, key: ProfileKey, every: int) -> bool:
        if every < 1:
            return False
        return bool(self._call("claim", self._claim, keys=[self._k("fb", key)], args=[every]))

    def record_refresh(self, key: ProfileKey, decision: dict[str, Any]) -> None:
        self._call(
            "record refresh",
            self._client.hset,
            self._k("fb", key),
            mapping={"last_refresh": json.dumps(decision, allow_nan=False), "since_refresh": 0},
        )

    def reset(self, key: ProfileKey) -> None:
        self._call(
            "reset",
            self._client.delete,
            self._k("fb", key),
            self._k("fbheld", key),
            self._k("ul", key),
        )

    def close(self) -> None:
        self._client.close()
