"""Online calibration state (DESIGN §2.8): the evidence cache and the running statistics.

Every retrieval leaves its *evidence* here for a bounded time and count: the N scores, the
attention evidence per layer of Λ, and which profile (model, name, labels, N, version) it
was served under, keyed by the request id. Never the images, never the query. A later
``POST /v1/feedback`` (the correct candidate, by request id) turns that evidence into
running sums of the profile's feedback statistics, once per request id.

The statistics are kept as flat hashes of field -> number, the same layout in memory and
in Redis (``redis_online``), so one parser (:func:`snapshot_from`) reads both:

    feedback hash   r:t:j  Σ s_j over feedback whose answer sat at t;  c:t  how many
                    p:l:k  Σ a_k^(l) over feedback;  pc  how many
                    count, holdout, since_refresh, first_at, last_at; last_refresh (JSON)
    held-out list   the most recent held-out feedback [{s, a, t}], newest first (bounded)
    unlabelled hash pos:j  raw predicted position counts;  p:l:k, pc  attention sums of
                    every served request (the running prior: P needs no labels)

A request goes to the held-out list instead of the sums when the server drew it into the
held-out share: a random draw made when its evidence is cached and stored with it (every
replica reads the same draw), so refresh is judged on feedback it was not estimated from,
and no client can know or choose which of its feedback judges the refresh (the request id
it sends plays no part).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

import numpy as np

from calibration_store.base import StoreUnavailable
from calibration_store.profile import ProfileKey

COUNTED: Final = "counted"
DUPLICATE: Final = "duplicate"
UNKNOWN: Final = "unknown"
PROFILE_GONE: Final = "profile_deleted"

HOLDOUT_BUCKETS: Final[int] = 5
"""1 in HOLDOUT_BUCKETS served requests (drawn) is held out from the sums for the guard."""


def draw_held_out() -> bool:
    """The server's draw (OS randomness, 1 in HOLDOUT_BUCKETS) of whether a served request's
    feedback is held out. Nothing the client sends enters it, and it is made before the
    client could send feedback, so feedback cannot be aimed at the held-out share."""
    return secrets.randbelow(HOLDOUT_BUCKETS) == 0


def _short(x: float) -> float:
    """7 significant digits (float32 precision): enough for means, a third of the bytes."""
    return float(f"{x:.7g}")


@dataclass(frozen=True)
class Evidence:
    """What one retrieval leaves behind: floats and names, nothing of the images or query."""

    key: ProfileKey
    version: int | None
    scores: list[float]
    attention: list[list[float]]
    held_out: bool = False
    """Drawn when the evidence is made (``draw_held_out``): its feedback judges refreshes."""

    @classmethod
    def of(
        cls,
        key: ProfileKey,
        version: int | None,
        scores: Any,
        attention: Any,
        held_out: bool | None = None,
    ) -> Evidence:
        """The evidence of one retrieval; ``held_out`` None = the server's draw (a replay
        that must reproduce a split passes its own)."""
        s = np.asarray(scores, dtype=np.float64)
        a = np.asarray(attention, dtype=np.float64)
        if s.shape != (key.n,) or a.ndim != 2 or a.shape[1] != key.n:
            raise ValueError(f"evidence shapes {s.shape}, {a.shape} do not fit N={key.n}")
        held = draw_held_out() if held_out is None else bool(held_out)
        return cls(
            key, version, [_short(x) for x in s], [[_short(x) for x in row] for row in a], held
        )

    @property
    def raw_position(self) -> int:
        return int(np.argmax(self.scores))

    def to_json(self) -> str:
        return json.dumps(
            {
                "key": self.key.model_dump(),
                "v": self.version,
                "s": self.scores,
                "a": self.attention,
                "h": int(self.held_out),
            },
            allow_nan=False,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Evidence:
        d = json.loads(text)
        # evidence cached by a release before the draw ("h") gets its draw when read
        held = bool(d["h"]) if "h" in d else draw_held_out()
        return cls(ProfileKey.model_validate(d["key"]), d["v"], d["s"], d["a"], held)


@dataclass
class FeedbackSnapshot:
    """The running statistics of one profile key, as arrays (see module docstring)."""

    row_sums: np.ndarray
    row_counts: np.ndarray
    prior_sums: np.ndarray
    prior_count: int
    count: int
    holdout_count: int
    since_refresh: int
    first_at: float | None
    last_at: float | None
    holdout: list[tuple[np.ndarray, np.ndarray, int]]
    raw_positions: np.ndarray
    unlabelled_prior_sums: np.ndarray
    unlabelled_count: int
    last_refresh: dict[str, Any] | None = field(default=None)


def _num(h: dict[str, Any], name: str) -> float:
    return float(h.get(name, 0) or 0)


def snapshot_from(
    fb: dict[str, Any], held: list[str], ul: dict[str, Any], n: int, layers: int
) -> FeedbackSnapshot:
    """Parse the hashes and held-out list of one key (memory or Redis) into arrays."""
    rows = np.array([[_num(fb, f"r:{t}:{j}") for j in range(n)] for t in range(n)])
    counts = np.array([int(_num(fb, f"c:{t}")) for t in range(n)], dtype=np.int64)
    prior = np.array([[_num(fb, f"p:{i}:{k}") for k in range(n)] for i in range(layers)])
    ul_prior = np.array([[_num(ul, f"p:{i}:{k}") for k in range(n)] for i in range(layers)])
    holdout = []
    for text in held:
        d = json.loads(text)
        s, a = np.asarray(d["s"], dtype=np.float64), np.asarray(d["a"], dtype=np.float64)
        if s.shape == (n,) and a.shape == (layers, n):  # a layer change makes old ones moot
            holdout.append((s, a, int(d["t"])))
    last = fb.get("last_refresh")
    return FeedbackSnapshot(
        row_sums=rows,
        row_counts=counts,
        prior_sums=prior,
        prior_count=int(_num(fb, "pc")),
        count=int(_num(fb, "count")),
        holdout_count=int(_num(fb, "holdout")),
        since_refresh=int(_num(fb, "since_refresh")),
        first_at=_num(fb, "first_at") or None,
        last_at=_num(fb, "last_at") or None,
        holdout=holdout,
        raw_positions=np.array([int(_num(ul, f"pos:{j}")) for j in range(n)], dtype=np.int64),
        unlabelled_prior_sums=ul_prior,
        unlabelled_count=int(_num(ul, "pc")),
        last_refresh=json.loads(last) if last else None,
    )


@dataclass(frozen=True)
class FeedbackResult:
    """What one feedback call did: ``outcome`` is COUNTED, DUPLICATE, UNKNOWN or
    PROFILE_GONE; ``answer`` the answer on record (the first one, for a duplicate)."""

    outcome: str
    evidence: Evidence | None = None
    answer: int | None = None
    held_out: bool = False
    since_refresh: int = 0


@runtime_checkable
class OnlineStore(Protocol):
    """Evidence cache + running feedback statistics, shared by every replica of a backend."""

    ttl_s: float
    max_entries: int

    def put_evidence(self, request_id: str, evidence: Evidence) -> bool: ...
    def get_evidence(self, request_id: str) -> Evidence | None: ...
    def feedback(self, request_id: str, answer: int, profile_exists: bool) -> FeedbackResult: ...
    def snapshot(self, key: ProfileKey, layers: int) -> FeedbackSnapshot: ...
    def claim_refresh(self, key: ProfileKey, every: int) -> bool: ...
    def record_refresh(self, key: ProfileKey, decision: dict[str, Any]) -> None: ...
    def reset(self, key: ProfileKey) -> None: ...
    def close(self) -> None: ...


def feedback_increments(evidence: Evidence, answer: int) -> dict[str, float]:
    """The labelled sums one feedback adds (the same fields the Redis script writes)."""
    inc = {f"r:{answer}:{j}": s for j, s in enumerate(evidence.scores)}
    inc[f"c:{answer}"] = 1
    inc.update(
        {f"p:{i}:{k}": a for i, row in enumerate(evidence.attention) for k, a in enumerate(row)}
    )
    inc["pc"] = 1
    return inc


def unlabelled_increments(evidence: Evidence) -> dict[str, float]:
    """What every served request adds to the unlabelled statistics."""
    inc: dict[str, float] = {f"pos:{evidence.raw_position}": 1, "pc": 1}
    inc.update(
        {f"p:{i}:{k}": a for i, row in enumerate(evidence.attention) for k, a in enumerate(row)}
    )
    return inc


def key_id(key: ProfileKey) -> str:
    return json.dumps([key.model_id, key.name, key.label_scheme, key.n])


class MemoryOnlineStore:
    """In-process online state (the memory and file backends: one replica).

    The evidence cache is an insertion-ordered dict bounded by ``max_entries`` (oldest
    dropped) and ``ttl_s``; the statistics are the module's hashes. With ``path`` the
    statistics (not the short-lived evidence) are written there after every change, by
    atomic replace, and read back at start: feedback survives a restart of the file backend.
    """

    backend = "memory"

    def __init__(
        self,
        *,
        ttl_s: float = 900.0,
        max_entries: int = 100_000,
        holdout_max: int = 1000,
        path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.ttl_s, self.max_entries, self.holdout_max = ttl_s, max_entries, holdout_max
        self._evidence: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._done: dict[str, tuple[float, int]] = {}
        self._fb: dict[str, dict[str, Any]] = {}
        self._held: dict[str, list[str]] = {}
        self._ul: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreUnavailable(f"cannot open {self.path.parent}: {exc}") from exc
        if self.path is not None and self.path.exists():
            state = json.loads(self.path.read_text())
            self._fb, self._held, self._ul = state["feedback"], state["held"], state["unlabelled"]

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(
                json.dumps({"feedback": self._fb, "held": self._held, "unlabelled": self._ul})
            )
            os.replace(tmp, self.path)
        except OSError as exc:
            raise StoreUnavailable(f"cannot write online statistics: {exc}") from exc

    def _expire(self, now: float) -> None:
        while self._evidence:
            rid, (stamp, _) = next(iter(self._evidence.items()))
            if now - stamp < self.ttl_s and len(self._evidence) <= self.max_entries:
                break
            self._evidence.pop(rid)
            self._done.pop(rid, None)

    @contextlib.contextmanager
    def _saving(self, kid: str, request_id: str | None = None) -> Iterator[None]:
        """A change of one key's statistics (made inside, under the lock, ending in
        ``_save``) that is kept only if it was saved: on a failed save the key's tables
        are put back as they were, so a client told 503 has not been counted and its
        retry counts once."""
        before = [copy.deepcopy(table.get(kid)) for table in (self._fb, self._held, self._ul)]
        try:
            yield
        except BaseException:
            for table, old in zip((self._fb, self._held, self._ul), before, strict=True):
                if old is None:
                    table.pop(kid, None)
                else:
                    table[kid] = old
            if request_id is not None:
                self._done.pop(request_id, None)
            raise

    @staticmethod
    def _add(h: dict[str, Any], inc: dict[str, float]) -> None:
        for name, value in inc.items():
            h[name] = h.get(name, 0) + value

    def put_evidence(self, request_id: str, evidence: Evidence) -> bool:
        now = time.time()
        with self._lock:
            self._expire(now)
            if request_id in self._evidence:
                return False  # first retrieval under an id keeps it (a reused X-Request-ID)
            self._evidence[request_id] = (now, evidence.to_json())
            self._add(
                self._ul.setdefault(key_id(evidence.key), {}), unlabelled_increments(evidence)
            )
            self._expire(now)
        return True

    def get_evidence(self, request_id: str) -> Evidence | None:
        with self._lock:
            self._expire(time.time())
            found = self._evidence.get(request_id)
        return Evidence.from_json(found[1]) if found else None

    def feedback(self, request_id: str, answer: int, profile_exists: bool) -> FeedbackResult:
        now = time.time()
        with self._lock:
            self._expire(now)
            found = self._evidence.get(request_id)
            if found is None:
                return FeedbackResult(UNKNOWN)
            evidence = Evidence.from_json(found[1])
            if request_id in self._done:
                return FeedbackResult(DUPLICATE, evidence, self._done[request_id][1])
            if not profile_exists:
                return FeedbackResult(PROFILE_GONE, evidence)
            kid = key_id(evidence.key)
            with self._saving(kid, request_id):
                self._done[request_id] = (now, answer)
                fb = self._fb.setdefault(kid, {})
                held = evidence.held_out
                if held:
                    record = json.dumps(
                        {"s": evidence.scores, "a": evidence.attention, "t": answer}
                    )
                    self._held[kid] = [record, *self._held.get(kid, [])][: self.holdout_max]
                    self._add(fb, {"holdout": 1})
                else:
                    self._add(fb, feedback_increments(evidence, answer))
                self._add(fb, {"count": 1, "since_refresh": 1})
                fb.setdefault("first_at", now)
                fb["last_at"] = now
                self._save()
            return FeedbackResult(COUNTED, evidence, answer, held, int(fb["since_refresh"]))

    def snapshot(self, key: ProfileKey, layers: int) -> FeedbackSnapshot:
        kid = key_id(key)
        with self._lock:
            return snapshot_from(
                dict(self._fb.get(kid, {})),
                list(self._held.get(kid, [])),
                dict(self._ul.get(kid, {})),
                key.n,
                layers,
            )

    def claim_refresh(self, key: ProfileKey, every: int) -> bool:
        kid = key_id(key)
        with self._lock:
            fb = self._fb.get(kid, {})
            if every < 1 or fb.get("since_refresh", 0) < every:
                return False
            with self._saving(kid):
                fb["since_refresh"] = 0
                self._save()
            return True

    def record_refresh(self, key: ProfileKey, decision: dict[str, Any]) -> None:
        kid = key_id(key)
        with self._lock, self._saving(kid):
            fb = self._fb.setdefault(kid, {})
            fb["last_refresh"] = json.dumps(decision, allow_nan=False)
            fb["since_refresh"] = 0
            self._save()

    def reset(self, key: ProfileKey) -> None:
        kid = key_id(key)
        with self._lock, self._saving(kid):
            for table in (self._fb, self._held, self._ul):
                table.pop(kid, None)
            self._save()

    def close(self) -> None:
        return None
