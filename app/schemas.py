"""Wire schemas (pydantic): what clients send and receive. Engine types never leave app.service.

Limits that depend on settings (number of images, bytes, pixels, query length) are checked
in app.decode so their errors name the setting; the shapes checked here are fixed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.engine.methods import METHODS, Method
from calibration_store.profile import NAME_PATTERN

MAX_CALIBRATION_EXAMPLES = 64
RECOMMENDED_CALIBRATION_EXAMPLES = 5

Labels = str | list[str]
LABELS_DESCRIPTION = (
    'label scheme ("digits", "upper", "lower", "roman", "words") or an explicit list of N labels'
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------- retrieve
class RetrieveOptions(_Strict):
    """How to answer (shared by the JSON and the multipart encodings of POST /v1/retrieve)."""

    method: Method = Field("agd", description=f"one of {', '.join(METHODS)}; agd is the default")
    profile: str = Field("default", pattern=NAME_PATTERN, description="calibration profile name")
    labels: Labels = Field("digits", description=LABELS_DESCRIPTION)
    return_details: bool = Field(False, description="also return scores, attention, layers")


class RetrieveRequest(RetrieveOptions):
    """One query and its N candidate images (JSON encoding of POST /v1/retrieve)."""

    query: str = Field(min_length=1, description="the caption to match", examples=["a red star"])
    images: list[str] = Field(
        min_length=1,
        description="N >= 2 candidate images, each a data:image/...;base64, URL or bare base64",
    )


class ProfileRef(BaseModel):
    name: str
    version: int


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
    label: str = Field(description="the label of the chosen image")
    probabilities: list[float] = Field(description="final (debiased) distribution, sums to 1")
    raw_probabilities: list[float] = Field(description="the model's own distribution")
    posterior: list[float] | None = Field(None, description="attention posterior π (agd)")
    method: str = Field(description="the method that produced the answer")
    debiased: bool = Field(description="false for vanilla, including the uncalibrated fallback")
    profile: ProfileRef | None = None
    model: str
    timings_ms: dict[str, float] = Field(
        description="decode, queue, forward, score, debias, encode (forward and score are "
        "totals of the batch this request ran in)"
    )
    details: RetrieveDetails | None = None


# ---------------------------------------------------------------------------- calibrate
class CalibrationExample(_Strict):
    query: str = Field(min_length=1)
    images: list[str] = Field(min_length=1, description="N images, same encodings as retrieve")
    answer: int = Field(ge=0, description="0-based index of the matching image")


class CalibrateRequest(_Strict):
    """M examples with known answers; every example must have the same number of images N."""

    examples: list[CalibrationExample] = Field(
        min_length=1,
        max_length=MAX_CALIBRATION_EXAMPLES,
        description=f"1..{MAX_CALIBRATION_EXAMPLES} examples; "
        f"{RECOMMENDED_CALIBRATION_EXAMPLES} is the recommended (and the paper's) setting",
    )
    profile: str = Field("default", pattern=NAME_PATTERN)
    labels: Labels = Field("digits", description=LABELS_DESCRIPTION)


class CalibrateResponse(BaseModel):
    profile: str
    version: int
    model: str
    labels: str = Field(description="label scheme name stored with the profile")
    n: int
    num_examples: int
    forward_passes: int = Field(description="M x N rotated instances run")
    bias_matrix: list[list[float]] = Field(description="B[t, j]: rows = GT position t")
    attention_prior: list[list[float]] = Field(description="P[l, k], rows in the order of layers")
    layers: list[int]
    sink_layers: list[int] = Field(
        default_factory=list,
        description="layers whose attention prior puts < 1e-6 on some position; with "
        "LAD_SINK_GUARD on (the default) they are left out of L*",
    )
    hyperparameters: dict[str, object]
    created_at: datetime | None
    duration_s: float


# ---------------------------------------------------------------------------- profiles
class ProfileVersion(BaseModel):
    version: int
    created_at: datetime | None
    num_examples: int
    current: bool


class ProfileEntry(BaseModel):
    """One (label scheme, N) of a profile name with its kept versions."""

    labels: str
    n: int
    current_version: int
    created_at: datetime | None
    num_examples: int
    compatible: bool = Field(description="its fingerprint matches the running engine")
    versions: list[ProfileVersion] = Field(default_factory=list)


class ProfileSummary(BaseModel):
    name: str
    model: str
    entries: list[ProfileEntry]


class ProfileList(BaseModel):
    model: str
    profiles: list[ProfileSummary]


class ProfileDeleted(BaseModel):
    name: str
    labels: str
    n: int
    deleted: bool


class ProfileRolledBack(BaseModel):
    name: str
    labels: str
    n: int
    version: int = Field(description="the version now current")
    previous_version: int


# ---------------------------------------------------------------------------- health
class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    ready: bool
    model: dict[str, object]
    store: dict[str, object]
    queue: dict[str, int]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorDetail
