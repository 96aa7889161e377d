"""Online calibration (DESIGN §2.8): remember each retrieval's evidence, count feedback,
refresh a profile from offline + feedback statistics behind an accuracy guard.

Refresh is pure arithmetic on stored sums (no forward pass). It blends the live version's
*offline* statistics with the feedback sums (``calibrate.blend``), then judges the blend
and the live version on the held-out feedback: the blend goes live only if it is at least
as accurate there (or the operator forces it); otherwise the decision, with its reason, is
recorded as a candidate and the live version keeps serving.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
from starlette.concurrency import run_in_threadpool

from app import errors
from app.method.calibrate import CalibrationStats
from app.method.calibration_diagnostics import calibration_diagnostics
from app.method.methods import MethodConfig
from app.method.refresh import online_stats, refresh_calibration
from app.observability import logs
from app.service.profiles import ProfileService, calibration_of
from app.settings import Settings
from calibration_store import Evidence, OnlineStore, Profile, ProfileKey, StoreError
from calibration_store.evidence import FeedbackSnapshot
from lad_client.types import ProfileSummary, RefreshResponse

log = logging.getLogger(__name__)

EVIDENCE_PAUSE_S = 5.0
"""After the store failed to take a request's evidence, retrievals skip the evidence cache
this long (they stay fast while the store is down; those requests get no feedback)."""


def _iso(stamp: float | None) -> str | None:
    return None if stamp is None else datetime.fromtimestamp(stamp, UTC).isoformat()


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
        config: MethodConfig,
    ) -> None:
        self.metrics = profiles.metrics
        self.settings = settings
        self.profiles = profiles
        self.online = online
        self.config = config
        self._skip_until = 0.0

    async def call(self, fn: Any, *args: Any) -> Any:
        """An online-store call off the event loop, store errors translated."""
        try:
            return await run_in_threadpool(fn, *args)
        except StoreError as exc:
            raise errors.translate(exc) or errors.StoreUnavailable(str(exc)) from exc

    # ------------------------------------------------------------------ retrieve side
    async def remember(
        self,
        request_id: str | None,
        key: ProfileKey,
        version: int | None,
        scores: Any,
        attention: Any,
    ) -> None:
        """Keep a retrieval's evidence for feedback. Never fails the retrieval: a store that
        cannot take it is logged (that request just cannot receive feedback).

        Only for a profile that exists (the replica's copy, no store call): a client may
        name any (profile, labels, N) on a vanilla retrieve, and statistics kept per name
        it invents would grow without bound (feedback on them is refused anyway)."""
        if request_id is None or time.monotonic() < self._skip_until:
            return
        if self.profiles.store.get(key) is None:
            return
        try:
            evidence = Evidence.of(key, version, scores, attention)
            await run_in_threadpool(self.online.put_evidence, request_id, evidence)
        except StoreError as exc:
            # a store that is down would cost every retrieval its timeout: pause the cache
            self._skip_until = time.monotonic() + EVIDENCE_PAUSE_S
            log.warning("evidence not kept (paused %g s): %s", EVIDENCE_PAUSE_S, exc)
        except ValueError as exc:
            log.warning("evidence of request %s not kept: %s", request_id, exc)

    async def auto_refresh(self, key: ProfileKey) -> dict[str, Any] | None:
        """Refresh when LAD_FEEDBACK_REFRESH_EVERY new feedback arrived (one replica claims it)."""
        claimed = await self.call(
            self.online.claim_refresh, key, self.settings.feedback_refresh_every
        )
        if not claimed:
            return None
        try:
            done = await self.refresh_key(key, force=False)
        except errors.ServiceError as exc:
            log.warning("automatic refresh of %s failed: %s", key, exc.message)
            return {"live": False, "reason": exc.message}
        return {"live": done.live, "reason": done.reason, "version": done.version}

    # ------------------------------------------------------------------ refresh
    async def refresh_key(self, key: ProfileKey, force: bool) -> RefreshResponse:
        live = await self.profiles.call("get", self.profiles.store.get, key)
        if live is None:
            raise errors.ProfileNotFound(
                f"no profile {key.name!r} with labels {key.label_scheme} and N={key.n}"
            )
        if live.calibration_statistics is None:
            raise errors.RefreshUnavailable(
                f"profile {key.name!r} v{live.version} keeps no offline calibration statistics "
                "(calibrated before online calibration existed); recalibrate it once"
            )
        snap: FeedbackSnapshot = await self.call(self.online.snapshot, key, len(live.layers))
        offline = CalibrationStats.from_dict(live.calibration_statistics)
        fb = online_stats(snap, self.settings.refresh_prior)
        out = refresh_calibration(
            calibration_of(live),
            offline,
            fb,
            snap.holdout,
            self.config,
            min_row_count=self.settings.feedback_min_row_count,
            min_holdout=self.settings.refresh_min_holdout,
            force=force,
        )
        new, go, reason = out.calibration, out.live, out.reason
        acc_live, acc_new, held = out.accuracy_live, out.accuracy_refreshed, out.held_out
        provenance = {
            "source": "refresh",
            "from_version": live.version,
            "offline_examples": live.num_examples,
            "feedback": int(snap.count),
            "feedback_in_sums": int(fb.row_counts.sum()),
            "held_out": held,
            "rows_from_feedback": out.trusted_rows,
            "min_row_count": self.settings.feedback_min_row_count,
            "window": {"first": _iso(snap.first_at), "last": _iso(snap.last_at)},
            "accuracy_live": acc_live,
            "accuracy_refreshed": acc_new,
            "forced": force,
        }
        version = None
        if go:
            refreshed = Profile.create(
                name=live.name,
                fingerprint=live.fingerprint,
                layers=live.layers,
                bias_matrix=new.bias_matrix,
                attention_prior=new.attention_prior,
                num_examples=live.num_examples,
                num_forward_passes=0,
                hyperparameters=live.hyperparameters,
                sink_layers=[live.layers[i] for i in new.sink_layers],
                calibration_position_share=live.calibration_position_share,
                calibration_statistics=live.calibration_statistics,
                provenance=provenance,
                diagnostics=live.diagnostics,
            )
            version = (await self.profiles.put(refreshed)).version
        decision = {
            "at": _iso(time.time()),
            "live": go,
            "reason": reason,
            "version": version,
            "previous_version": live.version,
            "accuracy_live": acc_live,
            "accuracy_refreshed": acc_new,
            "held_out": held,
        }
        if not go:
            decision["candidate"] = {
                "bias_matrix": new.bias_matrix.tolist(),
                "attention_prior": new.attention_prior.tolist(),
                "provenance": provenance,
            }
        await self.call(self.online.record_refresh, key, decision)
        self.metrics.refreshes.labels(decision="live" if go else "candidate").inc()
        logs.note(version=version)
        return RefreshResponse(
            profile=key.name,
            labels=key.label_scheme,
            n=key.n,
            live=go,
            reason=reason,
            version=version,
            previous_version=live.version,
            accuracy_live=acc_live,
            accuracy_refreshed=acc_new,
            held_out=held,
            provenance=provenance,
            bias_matrix=new.bias_matrix.tolist(),
            attention_prior=new.attention_prior.tolist(),
            diagnostics={
                "held_out_accuracy": out.held_out_by_method,
                "calibration": live.diagnostics,
            },
        )

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
            profile = await self.profiles.call("get", self.profiles.store.get, key)
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


def calibration_record(
    stats: CalibrationStats, scores: Any, attention: Any, gt: Any, config: MethodConfig
) -> dict[str, Any]:
    """What a calibration stores for online use: its offline sums ``stats`` (refresh blends
    feedback into them), its provenance and its diagnostics (from the same evidence, no
    extra pass)."""
    n = stats.n
    return {
        "calibration_statistics": stats.to_dict(),
        "provenance": {"source": "offline", "offline_examples": len(gt) // n},
        "diagnostics": calibration_diagnostics(scores, attention, gt, n, config),
    }
