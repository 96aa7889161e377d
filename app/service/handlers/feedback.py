"""POST /v1/feedback and POST /v1/profiles/{name}/refresh behind the routes (design §2.8):
count which candidate of an earlier retrieval was right, and blend the feedback into a
profile behind the accuracy guard (``OnlineService``). Every store call is off the event
loop."""

from __future__ import annotations

from app import errors
from app.observability import logs
from app.service.feedback import OnlineService
from calibration_store import ProfileKey
from calibration_store.evidence import COUNTED, DUPLICATE, PROFILE_GONE
from lad_client.types import FeedbackRequest, FeedbackResponse, RefreshResponse


async def feedback(online: OnlineService, body: FeedbackRequest) -> FeedbackResponse:
    """Adds the retrieval's evidence to its profile's feedback statistics, once per request
    id (a repeat answers ``counted: false``); may trigger the automatic refresh."""
    request_id, answer = body.request_id, body.answer
    evidence = await online.call(online.online.get_evidence, request_id)
    if evidence is None:
        raise errors.RequestNotFound(
            f"no evidence for request {request_id!r}: unknown, or older than "
            f"{online.settings.evidence_ttl_s:g} s (LAD_EVIDENCE_TTL_S)"
        )
    key: ProfileKey = evidence.key
    logs.note(profile=key.name, labels=key.label_scheme, n=key.n)
    if answer >= key.n:
        raise errors.InvalidRequest(
            f"answer {answer} is not an index of the request's {key.n} images (0..{key.n - 1})"
        )
    profiles = online.profiles
    exists = await profiles.call("get", profiles.store.get, key) is not None
    result = await online.call(online.online.feedback, request_id, answer, exists)
    if result.outcome == PROFILE_GONE:
        raise errors.ProfileGone(
            f"profile {key.name!r} (labels {key.label_scheme}, N={key.n}) that request "
            f"{request_id!r} was served under no longer exists; feedback is not kept"
        )
    if result.outcome not in (COUNTED, DUPLICATE):
        raise errors.RequestNotFound(f"the evidence of request {request_id!r} expired")
    online.metrics.feedback.labels(outcome=result.outcome).inc()
    refresh = None
    if result.outcome == COUNTED and online.settings.feedback_refresh_every > 0:
        refresh = await online.auto_refresh(key)
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


async def refresh(
    online: OnlineService, name: str, labels: str, n: int, force: bool
) -> RefreshResponse:
    """A refresh of the profile (name, labels text, N) asked for by the operator."""
    key = online.profiles.stored_key(name, labels, n)
    logs.note(profile=name, labels=key.label_scheme, n=n)
    return await online.refresh_key(key, force)
