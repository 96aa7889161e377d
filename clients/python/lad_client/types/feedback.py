"""POST /v1/feedback and /v1/profiles/{name}/refresh: online calibration from answers."""

from __future__ import annotations

from pydantic import BaseModel, Field

from lad_client.types.common import Strict
from lad_client.vocabulary import MAX_N


class FeedbackRequest(Strict):
    """Which candidate of an earlier retrieval was the right one."""

    request_id: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._:/+=-]+$",
        description="the `request_id` of the retrieve response",
    )
    answer: int = Field(
        ge=0,
        lt=MAX_N,
        description="0-based index of the correct image, in the order the retrieval was sent",
    )


class FeedbackResponse(BaseModel):
    """What the feedback did (idempotent: a repeat answers ``counted: false``)."""

    request_id: str = Field(description="the request the feedback is for")
    counted: bool = Field(description="true the first time; false for a repeat (not re-counted)")
    answer: int = Field(description="the answer on record (the first one sent)")
    profile: str = Field(description="the profile the feedback feeds")
    labels: str = Field(description="its label scheme")
    n: int = Field(description="its N")
    held_out: bool = Field(
        description="kept aside to judge refreshes (the server's random "
        "draw, 1 in 5, made when the retrieval was served)"
    )
    refresh: dict[str, object] | None = Field(
        None,
        description="the automatic refresh this feedback triggered "
        "(LAD_FEEDBACK_REFRESH_EVERY), if any",
    )


class RefreshResponse(BaseModel):
    """A refresh: the blended estimate, and whether it went live or stayed a candidate."""

    profile: str = Field(description="profile name")
    labels: str = Field(description="label scheme name")
    n: int = Field(description="number of images N")
    live: bool = Field(description="true when the refreshed version is now current")
    reason: str = Field(description="why it went live or stayed a candidate")
    version: int | None = Field(description="the new current version (null for a candidate)")
    previous_version: int = Field(description="the version current before the refresh")
    accuracy_live: float | None = Field(description="held-out accuracy of the previous version")
    accuracy_refreshed: float | None = Field(description="held-out accuracy of the refresh")
    held_out: int = Field(description="held-out feedback instances judged on")
    provenance: dict[str, object] = Field(description="offline examples, feedback count, window")
    bias_matrix: list[list[float]] = Field(description="the refreshed B")
    attention_prior: list[list[float]] = Field(description="the refreshed P")
    diagnostics: dict[str, object] | None = Field(
        None,
        description="held-out accuracy of vanilla, attn_pure and agd with the live and "
        "the refreshed calibration, and the offline calibration's diagnostics",
    )
