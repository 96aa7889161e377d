"""POST /v1/retrieve: one query, N candidate images, which one matches."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from lad_client.types.common import (
    EXAMPLE_IMAGES,
    LABELS_DESCRIPTION,
    ImageList,
    LabelsValue,
    Strict,
)
from lad_client.vocabulary import METHODS, NAME_PATTERN, Method

RETRIEVE_EXAMPLE: dict[str, object] = {
    "query": "a small green square",
    "images": list(EXAMPLE_IMAGES),
    "method": "vanilla",
}


class RetrieveOptions(Strict):
    """How to answer (shared by the JSON and the multipart encodings of POST /v1/retrieve)."""

    method: Method = Field("agd", description=f"one of {', '.join(METHODS)}; agd is the default")
    profile: str = Field("default", pattern=NAME_PATTERN, description="calibration profile name")
    labels: LabelsValue = Field("digits", description=LABELS_DESCRIPTION)
    return_details: bool = Field(False, description="also return scores, attention, layers")


class RetrieveRequest(RetrieveOptions):
    """One query and its N candidate images (JSON encoding of POST /v1/retrieve)."""

    model_config = ConfigDict(json_schema_extra={"examples": [RETRIEVE_EXAMPLE]})

    query: str = Field(
        min_length=1,
        max_length=100_000,
        description="the caption to match (at most LAD_MAX_QUERY_CHARS)",
        examples=["a red star"],
    )
    images: ImageList


class ProfileRef(BaseModel):
    """The calibration profile an answer used."""

    name: str = Field(description="profile name")
    version: int = Field(description="the profile version that was current")


class RetrieveDetails(BaseModel):
    """The evidence behind an answer (return_details=true)."""

    labels: list[str] = Field(description="the label strings c_0..c_{N-1}")
    scores: list[float] = Field(description="s_j: restricted label log-probs, image order")
    debiased_scores: list[float] | None = Field(None, description="d_j = s_j - beta_j (agd/pride)")
    attention: list[list[float]] | None = Field(None, description="a_k^(l), |Λ| x N")
    layers: list[int] = Field(description="candidate layers Λ")
    batch_size: int = Field(description="requests sharing the forward pass")


class RetrieveResponse(BaseModel):
    index: int = Field(description="0-based index into `images` of the chosen image")
    ranking: list[int] = Field(
        default_factory=list,
        description="every image's 0-based index, by final (debiased) "
        "probability, best first (ranking[0] == index; ties keep image order)",
    )
    label: str = Field(description="the label of the chosen image")
    probabilities: list[float] = Field(description="final (debiased) distribution, sums to 1")
    raw_probabilities: list[float] = Field(description="the model's own distribution")
    posterior: list[float] | None = Field(None, description="attention posterior π (agd)")
    method: str = Field(description="the method that produced the answer")
    debiased: bool = Field(description="false for vanilla, including the uncalibrated fallback")
    profile: ProfileRef | None = Field(
        None,
        description="the profile applied; null for vanilla, attn_raw, perm_avg and the "
        "uncalibrated fallback",
    )
    model: str = Field(description="the served model name that answered (LAD_SERVED_MODEL_NAME)")
    timings_ms: dict[str, float] = Field(
        description="decode (base64 + image decode + checks), base64, queue, process (the "
        "model's processor), forward, score, debias, encode (process, forward and score are "
        "totals of the batch this request ran in)"
    )
    details: RetrieveDetails | None = Field(
        None, description="the evidence behind the answer, with return_details=true"
    )
    request_id: str | None = Field(
        None,
        description="this request's id (= the X-Request-ID header): POST /v1/feedback "
        "with it and the correct index to improve the profile (docs/calibration.md)",
    )
