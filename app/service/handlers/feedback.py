"""POST /v1/feedback and POST /v1/profiles/{name}/refresh behind the routes (design §2.8):
count which candidate of an earlier retrieval was right, and blend the feedback into a
profile behind the accuracy guard. Every store call is off the event loop.

Refresh is pure arithmetic on stored sums (no forward pass). It blends the live version's
*offline* statistics with the feedback sums (``calibrate.blend``), then judges the blend
and the live version on the held-out feedback: the blend goes live only if it is at least
as accurate there (or the operator forces it); otherwise the decision, with its reason, is
recorded as a candidate and the live version keeps serving. Both run the stages of every
request: feedback decode (the evidence, the answer) -> plan (the profile still exists) ->
encode (counted; the automatic refresh); refresh decode (the key) -> plan (the live
version and its feedback) -> debias (the blend and the guard) -> encode (stored if it goes
live, the decision recorded, the answer).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from app import errors
from app.method.calibrate import CalibrationStats
from app.method.refresh import RefreshOutcome, online_stats, refresh_calibration
from app.observability import logs
from app.service.online import OnlineService
from app.service.pipeline import (
    DECODE,
    ENCODE,
    ESTIMATE,
    PLAN,
    Context,
    Handler,
    Pipeline,
    stage,
)
from calibration_store import Evidence, Profile, ProfileKey
from calibration_store.evidence import COUNTED, DUPLICATE, PROFILE_GONE, FeedbackSnapshot
from lad_client.types import FeedbackRequest, FeedbackResponse, RefreshResponse

log = logging.getLogger(__name__)


def _iso(stamp: float | None) -> str | None:
    return None if stamp is None else datetime.fromtimestamp(stamp, UTC).isoformat()


@dataclass
class RefreshContext(Context):
    """One refresh: the profile key, the live version, its feedback and the decision."""

    key: ProfileKey | None = None
    force: bool = False
    live: Profile | None = None  # plan
    snap: FeedbackSnapshot | None = None  # plan
    feedback: CalibrationStats | None = None  # estimate
    outcome: RefreshOutcome | None = None  # estimate
    provenance: dict[str, Any] = field(default_factory=dict)  # estimate


class Refresh(Handler):
    """The refresh feature (the operator's POST, or feedback's automatic one): plan (the
    live version and its feedback), estimate (the blend, judged), encode."""

    def __init__(self, pipeline: Pipeline, online: OnlineService) -> None:
        super().__init__(pipeline)
        self.online = online

    async def __call__(self, name: str, labels: str, n: int, force: bool) -> RefreshResponse:
        """A refresh of the profile (name, labels text, N) asked for by the operator."""
        key = self.pipeline.profiles.stored_key(name, labels, n)
        logs.note(profile=name, labels=key.label_scheme, n=n)
        return await self.of(key, force)

    async def of(self, key: ProfileKey, force: bool) -> RefreshResponse:
        ctx = RefreshContext(key=key, force=force)
        with stage(ctx, PLAN):
            await self.plan(ctx)
        with stage(ctx, ESTIMATE):
            self.estimate(ctx)
        with stage(ctx, ENCODE):
            response = await self.encode(ctx)
        self.pipeline.finish(ctx)
        return response

    async def plan(self, ctx: RefreshContext) -> None:
        """The live version (it must keep its offline sums) and its feedback."""
        key = ctx.key
        assert key is not None
        live = await self.pipeline.profiles.get(key)
        if live is None:
            raise errors.ProfileNotFound(
                f"no profile {key.name!r} with labels {key.label_scheme} and N={key.n}"
            )
        if live.calibration_statistics is None:
            raise errors.RefreshUnavailable(
                f"profile {key.name!r} v{live.version} keeps no offline calibration statistics "
                "(calibrated before online calibration existed); recalibrate it once"
            )
        ctx.live = live
        ctx.snap = await self.online.call(self.online.online.snapshot, key, len(live.layers))

    def estimate(self, ctx: RefreshContext) -> None:
        """The blend of offline and feedback sums, judged against the live version."""
        live, snap, settings = ctx.live, ctx.snap, self.pipeline.settings
        assert live is not None and snap is not None and live.calibration_statistics is not None
        offline = CalibrationStats.from_dict(live.calibration_statistics)
        ctx.feedback = fb = online_stats(snap, settings.refresh_prior)
        ctx.outcome = out = refresh_calibration(
            self.pipeline.profiles.calibration(live),
            offline,
            fb,
            snap.holdout,
            self.pipeline.method_config,
            min_row_count=settings.feedback_min_row_count,
            min_holdout=settings.refresh_min_holdout,
            force=ctx.force,
        )
        ctx.provenance = {
            "source": "refresh",
            "from_version": live.version,
            "offline_examples": live.num_examples,
            "feedback": int(snap.count),
            "feedback_in_sums": int(fb.row_counts.sum()),
            "held_out": out.held_out,
            "rows_from_feedback": out.trusted_rows,
            "min_row_count": settings.feedback_min_row_count,
            "window": {"first": _iso(snap.first_at), "last": _iso(snap.last_at)},
            "accuracy_live": out.accuracy_live,
            "accuracy_refreshed": out.accuracy_refreshed,
            "forced": ctx.force,
        }

    async def _store(self, live: Profile, out: RefreshOutcome, provenance: dict[str, Any]) -> int:
        """The refreshed version, current now; its number."""
        new = out.calibration
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
        return (await self.pipeline.profiles.put(refreshed)).version

    async def encode(self, ctx: RefreshContext) -> RefreshResponse:
        """Stored when it goes live; the decision recorded either way; the answer."""
        key, live, out, provenance = ctx.key, ctx.live, ctx.outcome, ctx.provenance
        assert key is not None and live is not None and out is not None
        new, go = out.calibration, out.live
        version = await self._store(live, out, provenance) if go else None
        decision: dict[str, Any] = {
            "at": _iso(time.time()),
            "live": go,
            "reason": out.reason,
            "version": version,
            "previous_version": live.version,
            "accuracy_live": out.accuracy_live,
            "accuracy_refreshed": out.accuracy_refreshed,
            "held_out": out.held_out,
        }
        if not go:
            decision["candidate"] = {
                "bias_matrix": new.bias_matrix.tolist(),
                "attention_prior": new.attention_prior.tolist(),
                "provenance": provenance,
            }
        await self.online.call(self.online.online.record_refresh, key, decision)
        self.pipeline.metrics.refreshes.labels(decision="live" if go else "candidate").inc()
        logs.note(version=version)
        return RefreshResponse(
            profile=key.name,
            labels=key.label_scheme,
            n=key.n,
            live=go,
            reason=out.reason,
            version=version,
            previous_version=live.version,
            accuracy_live=out.accuracy_live,
            accuracy_refreshed=out.accuracy_refreshed,
            held_out=out.held_out,
            provenance=provenance,
            bias_matrix=new.bias_matrix.tolist(),
            attention_prior=new.attention_prior.tolist(),
            diagnostics={
                "held_out_accuracy": out.held_out_by_method,
                "calibration": live.diagnostics,
            },
        )


@dataclass
class FeedbackContext(Context):
    """One feedback: the request, the evidence it names, and what counting it did."""

    body: FeedbackRequest | None = None
    evidence: Evidence | None = None  # decode
    exists: bool = False  # plan


class Feedback(Handler):
    """The feedback feature: decode (the evidence), plan (its profile), encode (counted);
    every LAD_FEEDBACK_REFRESH_EVERY counted feedback
    triggers the automatic refresh (one replica claims it)."""

    def __init__(self, pipeline: Pipeline, online: OnlineService, refresh: Refresh) -> None:
        super().__init__(pipeline)
        self.online = online
        self.refresh = refresh

    async def __call__(self, body: FeedbackRequest) -> FeedbackResponse:
        """Adds the retrieval's evidence to its profile's feedback statistics, once per
        request id (a repeat answers ``counted: false``)."""
        ctx = FeedbackContext(body=body)
        with stage(ctx, DECODE):
            await self.decode(ctx)
        with stage(ctx, PLAN):
            await self.plan(ctx)
        with stage(ctx, ENCODE):
            response = await self.encode(ctx)
        self.pipeline.finish(ctx)
        return response

    def _body(self, ctx: FeedbackContext) -> FeedbackRequest:
        assert ctx.body is not None
        return ctx.body

    def _key(self, ctx: FeedbackContext) -> ProfileKey:
        assert ctx.evidence is not None
        return ctx.evidence.key

    async def decode(self, ctx: FeedbackContext) -> None:
        """The evidence the request id names (404 once expired) and the answer within N."""
        request_id, answer = self._body(ctx).request_id, self._body(ctx).answer
        await self.online.writes.settled(request_id)  # a write still queued on this replica
        ctx.evidence = await self.online.call(self.online.online.get_evidence, request_id)
        if ctx.evidence is None:
            why = self.online.writes.lost(request_id)
            if why is not None:  # the store's fault, not the client's: say which
                raise errors.StoreUnavailable(
                    f"the evidence of request {request_id!r} was not kept: {why}; feedback "
                    "for it cannot be counted"
                )
            raise errors.RequestNotFound(
                f"no evidence for request {request_id!r}: unknown, or older than "
                f"{self.pipeline.settings.evidence_ttl_s:g} s (LAD_EVIDENCE_TTL_S)"
            )
        key = self._key(ctx)
        logs.note(profile=key.name, labels=key.label_scheme, n=key.n)
        if answer >= key.n:
            raise errors.InvalidRequest(
                f"answer {answer} is not an index of the request's {key.n} images (0..{key.n - 1})"
            )

    async def plan(self, ctx: FeedbackContext) -> None:
        """Whether the profile the request was served under still exists."""
        ctx.exists = await self.pipeline.profiles.get(self._key(ctx)) is not None

    async def _auto_refresh(self, key: ProfileKey) -> dict[str, Any] | None:
        """Refresh when LAD_FEEDBACK_REFRESH_EVERY new feedback arrived (one replica
        claims it); a failed refresh is reported in the answer, never raised."""
        every = self.pipeline.settings.feedback_refresh_every
        if not await self.online.call(self.online.online.claim_refresh, key, every):
            return None
        try:
            done = await self.refresh.of(key, force=False)
        except errors.ServiceError as exc:
            log.warning("automatic refresh of %s failed: %s", key, exc.message)
            return {"live": False, "reason": exc.message}
        return {"live": done.live, "reason": done.reason, "version": done.version}

    async def encode(self, ctx: FeedbackContext) -> FeedbackResponse:
        """Counted once per request id; the automatic refresh when it is due."""
        body, key = self._body(ctx), self._key(ctx)
        request_id, answer = body.request_id, body.answer
        online = self.online
        result = await online.call(online.online.feedback, request_id, answer, ctx.exists)
        if result.outcome == PROFILE_GONE:
            raise errors.ProfileGone(
                f"profile {key.name!r} (labels {key.label_scheme}, N={key.n}) that request "
                f"{request_id!r} was served under no longer exists; feedback is not kept"
            )
        if result.outcome not in (COUNTED, DUPLICATE):
            raise errors.RequestNotFound(f"the evidence of request {request_id!r} expired")
        self.pipeline.metrics.feedback.labels(outcome=result.outcome).inc()
        refresh = None
        if result.outcome == COUNTED and self.pipeline.settings.feedback_refresh_every > 0:
            refresh = await self._auto_refresh(key)
        return FeedbackResponse(
            request_id=request_id,
            counted=result.outcome == COUNTED,
            answer=int(result.answer if result.answer is not None else answer),
            profile=key.name,
            labels=key.label_scheme,
            n=key.n,
            held_out=result.held_out,
            refresh=refresh,
        )
