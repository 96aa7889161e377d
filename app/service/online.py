"""Online calibration's store side (DESIGN §2.8): remember each retrieval's evidence, the
online store's calls, a profile's online status. The feedback and refresh handlers
(``app.service.handlers.feedback``) count feedback and refresh a profile through it.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from app import errors
from app.service.evidence_writes import EvidenceWrites
from app.service.profile_service import ProfileService
from app.settings import Settings
from calibration_store import Evidence, OnlineStore, Profile, ProfileKey
from calibration_store.evidence import FeedbackSnapshot
from lad_client.types import ProfileSummary

log = logging.getLogger(__name__)


def raw_drift(snap: FeedbackSnapshot, profile: Profile) -> dict[str, Any] | None:
    """Total variation distance between the raw answer positions of served requests and the
    ones the calibration saw (``calibration_position_share``): 0 = same, 1 = disjoint."""
    total = int(snap.raw_positions.sum())
    if total == 0 or profile.calibration_position_share is None:
        return None
    live = snap.raw_positions / total
    ref = np.asarray(profile.calibration_position_share)
    return {
        "distance": round(float(0.5 * np.abs(live - ref).sum()), 4),
        "requests": total,
        "live_share": [round(float(x), 4) for x in live],
        "calibration_share": [round(float(x), 4) for x in ref],
    }


class OnlineService:
    """The online calibration loop of one model over one profile store and one online store."""

    def __init__(
        self,
        settings: Settings,
        profiles: ProfileService,
        online: OnlineStore,
    ) -> None:
        self.metrics = profiles.metrics
        self.settings = settings
        self.profiles = profiles
        self.online = online
        self.writes = EvidenceWrites(online, self.metrics)

    async def call(self, fn: Any, *args: Any) -> Any:
        """An online-store call off the event loop, store errors translated (by
        ``ProfileService.call``, the one translation)."""
        return await self.profiles.call(None, fn, *args)

    # ------------------------------------------------------------------ retrieve side
    async def remember(
        self,
        request_id: str | None,
        key: ProfileKey,
        version: int | None,
        scores: Any,
        attention: Any,
    ) -> None:
        """Keep a retrieval's evidence for feedback without waiting on the store: queued
        (``EvidenceWrites``); a store that cannot take it costs that request its feedback
        (answered 503 with the store's reason), never the retrieval its time.

        Only for a profile that exists (the replica's copy, no store call): a client may
        name any (profile, labels, N) on a vanilla retrieve, and statistics kept per name
        it invents would grow without bound (feedback on them is refused anyway)."""
        if request_id is None or self.profiles.peek(key) is None:
            return
        try:
            evidence = Evidence.of(key, version, scores, attention)
        except ValueError as exc:
            log.warning("evidence of request %s not kept: %s", request_id, exc)
            return
        self.writes.offer(request_id, evidence)

    # ------------------------------------------------------------------ status
    def _status(self, key: ProfileKey, profile: Profile) -> dict[str, Any]:
        snap = self.online.snapshot(key, len(profile.layers))
        last = dict(snap.last_refresh) if snap.last_refresh else None
        if last is not None:
            last.pop("candidate", None)  # B and P of a candidate: in the refresh response
        return {
            "feedback": snap.count,
            "feedback_held_out": snap.holdout_count,
            "feedback_since_refresh": snap.since_refresh,
            "feedback_per_row": [int(c) for c in snap.row_counts],
            "served_requests": snap.unlabelled_count,
            "drift": raw_drift(snap, profile),
            "last_refresh": last,
            "provenance": profile.provenance,
            "diagnostics": profile.diagnostics,
        }

    async def annotate(self, summary: ProfileSummary) -> ProfileSummary:
        """Fill each entry's ``online`` block (GET /v1/profiles/{name}); while the online
        store is unavailable the blocks stay empty (the read answers from the replica)."""
        for entry in summary.entries:
            key = self.profiles.key(summary.name, entry.labels, entry.n)
            profile = await self.profiles.get(key)
            if profile is not None:
                try:
                    entry.online = await self.call(self._status, key, profile)
                except errors.StoreUnavailable:
                    self.metrics.store_errors.labels(operation="get").inc()
                    return summary
        return summary

    async def forget(self, name: str, labels: str, n: int) -> None:
        """A deleted profile's feedback statistics go with it."""
        await self.call(self.online.reset, self.profiles.stored_key(name, labels, n))
