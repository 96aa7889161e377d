"""Wire schemas (pydantic): what clients send and receive. Engine types never leave app.service.

Limits that depend on settings (number of images, bytes, pixels, query length) are checked
in app.decode so their errors name the setting; the shapes checked here are fixed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from app.engine.labels import SCHEMES
from app.engine.methods import METHODS, Method
from app.errors import ERRORS
from app.settings import MAX_N
from calibration_store.profile import NAME_PATTERN

MAX_CALIBRATION_EXAMPLES = 64
RECOMMENDED_CALIBRATION_EXAMPLES = 5
MAX_VERSION = 2**31 - 1

LABELS_DESCRIPTION = (
    'label scheme ("digits", "upper", "lower", "roman", "words") or an explicit list of N '
    "distinct labels"
)
LABELS_JSON_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "enum": list(SCHEMES)},
        {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 32},
            "minItems": 2,
            "maxItems": MAX_N,
            "uniqueItems": True,
        },
    ],
    "default": "digits",
    "description": LABELS_DESCRIPTION,
}
"""What `labels` accepts (the limits are patched to the running settings in the OpenAPI
document); the service checks it itself, so a bad value answers 422 invalid_labels."""

Labels = Annotated[str | list[str], WithJsonSchema(LABELS_JSON_SCHEMA)]
ImageList = Annotated[
    list[str],
    Field(
        min_length=2,
        max_length=MAX_N,
        description="N >= 2 candidate images (at most LAD_MAX_IMAGES), each a "
        "data:image/...;base64, URL or bare base64 of a JPEG, PNG, WebP, GIF or BMP",
    ),
]


# Three 32 x 32 PNGs (a red circle, a green square, a blue triangle): the examples of the
# OpenAPI document, valid input for "Try it out".
EXAMPLE_IMAGES: tuple[str, ...] = (
    (
        "iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAgUlEQVR42u1W2w3AIAiUS5foCO4/jCN0Av87QK1c"
        "oIQ0gU9zDzVyKHPOFllowVUG+QYHibt6fy6eY6hEUZ/pUpq3gVNdxcCpriLhV9/j8Yn6hpXRB7btv3ErKsogxIDJ"
        "SD74kq7IdoglC7aU5/EwTxISCc+0YjBC/uwCZ3J18u8Nbog+MrtWHm33AAAAAElFTkSuQmCC"
    ),
    (
        "iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAPUlEQVR42mP8+vUrAy0BEwONwagFI8ACFqyimqvd"
        "yTPueujO0TgYtWDUglELRi0YtWBYWsA42rIbtYBiAACqRwj/SUU4RgAAAABJRU5ErkJggg=="
    ),
    (
        "iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAeUlEQVR42mP8+vUrAy0BEwONwagF1LfAOPD5UPYB"
        "xPkkeWIw+QDZ4cR7YtD4ANPJRHpicPgAl2OJ8cQg8AF+ZxL0xED7gJhQxq9mQH1AfHbFo3LgfEBquY9L/QD5gFTn"
        "49E1ED4gz/m49NLdB5Q4H6sJjKNt0wG3AAAaOyaawcmNfwAAAABJRU5ErkJggg=="
    ),
)
RETRIEVE_EXAMPLE: dict[str, object] = {
    "query": "a small green square", "images": list(EXAMPLE_IMAGES), "method": "vanilla",
}
CALIBRATE_EXAMPLE: dict[str, object] = {
    "profile": "default", "labels": "digits",
    "examples": [{"query": "a small green square", "images": list(EXAMPLE_IMAGES), "answer": 1}],
}


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

    model_config = ConfigDict(json_schema_extra={"examples": [RETRIEVE_EXAMPLE]})

    query: str = Field(
        min_length=1, max_length=100_000, description="the caption to match (at most "
        "LAD_MAX_QUERY_CHARS)", examples=["a red star"],
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
        default_factory=list, description="every image's 0-based index, by final (debiased) "
        "probability, best first (ranking[0] == index; ties keep image order)",
    )
    label: str = Field(description="the label of the chosen image")
    probabilities: list[float] = Field(description="final (debiased) distribution, sums to 1")
    raw_probabilities: list[float] = Field(description="the model's own distribution")
    posterior: list[float] | None = Field(None, description="attention posterior π (agd)")
    method: str = Field(description="the method that produced the answer")
    debiased: bool = Field(description="false for vanilla, including the uncalibrated fallback")
    profile: ProfileRef | None = Field(
        None, description="the profile applied; null for vanilla, attn_raw, perm_avg and the "
        "uncalibrated fallback"
    )
    model: str = Field(description="the model id that answered (LAD_MODEL)")
    timings_ms: dict[str, float] = Field(
        description="decode (base64 + image decode + checks), base64, queue, process (the "
        "model's processor), forward, score, debias, encode (process, forward and score are "
        "totals of the batch this request ran in)"
    )
    details: RetrieveDetails | None = Field(
        None, description="the evidence behind the answer, with return_details=true"
    )
    request_id: str | None = Field(
        None, description="this request's id (= the X-Request-ID header): POST /v1/feedback "
        "with it and the correct index to improve the profile (docs/calibration.md)"
    )


# ---------------------------------------------------------------------------- calibrate
class CalibrationExample(_Strict):
    """One calibration example: a query, its N images and which one matches."""

    query: str = Field(
        min_length=1, max_length=100_000, description="the caption of the matching image"
    )
    images: ImageList
    answer: int = Field(ge=0, lt=MAX_N, description="0-based index of the matching image")


class CalibrateRequest(_Strict):
    """M examples with known answers; every example must have the same number of images N."""

    examples: list[CalibrationExample] = Field(
        min_length=1,
        max_length=MAX_CALIBRATION_EXAMPLES,
        description=f"1..{MAX_CALIBRATION_EXAMPLES} examples; "
        f"{RECOMMENDED_CALIBRATION_EXAMPLES} is the recommended (and the paper's) setting",
    )
    profile: str = Field("default", pattern=NAME_PATTERN, description="profile name to calibrate")
    labels: Labels = Field("digits", description=LABELS_DESCRIPTION)
    n: list[Annotated[int, Field(ge=2, le=MAX_N)]] | Literal["all"] | None = Field(
        None,
        min_length=1,
        max_length=MAX_N,
        description="calibrate several N from the same "
        'examples: a list of N, or "all" (2 up to the smallest example\'s candidate count); '
        "each example then carries at least max(n) candidates, and each N is built from the "
        "GT plus N - 1 of its negatives (seeded by `seed`). One profile version per N, all "
        "stored or none. Unset: one profile for the examples' common N",
    )
    seed: int = Field(0, ge=0, le=2**32 - 1, description="seed of the negatives kept per N")

    model_config = ConfigDict(json_schema_extra={"examples": [CALIBRATE_EXAMPLE]})


class CalibratedN(BaseModel):
    """One N of a multi-N calibration."""

    n: int = Field(description="number of images N")
    version: int = Field(description="the new version of the profile for this N, now current")
    forward_passes: int = Field(description="M x N rotated instances run for this N")
    bias_matrix: list[list[float]] = Field(description="B[t, j]: rows = GT position t")
    attention_prior: list[list[float]] = Field(description="P[l, k], rows in the order of layers")
    sink_layers: list[int] = Field(default_factory=list, description="see the top level")


class CalibrateResponse(BaseModel):
    """The new profile version and its estimates."""

    profile: str = Field(description="profile name")
    version: int = Field(description="the new version, now current")
    model: str = Field(description="the model id the profile is for")
    labels: str = Field(description="label scheme name stored with the profile")
    n: int = Field(description="number of images N the profile is for")
    num_examples: int = Field(description="M, calibration examples used")
    forward_passes: int = Field(description="M x N rotated instances run")
    bias_matrix: list[list[float]] = Field(description="B[t, j]: rows = GT position t")
    attention_prior: list[list[float]] = Field(description="P[l, k], rows in the order of layers")
    layers: list[int] = Field(description="candidate layers Λ (rows of attention_prior)")
    sink_layers: list[int] = Field(
        default_factory=list,
        description="layers whose attention prior puts < 1e-6 on some position; with "
        "LAD_SINK_GUARD on (the default) they are left out of L*",
    )
    hyperparameters: dict[str, object] = Field(
        description="the inference settings recorded with the profile (K, τ, variants, M)"
    )
    created_at: datetime | None = Field(description="when the store saved this version (UTC)")
    duration_s: float = Field(description="seconds the calibration took")
    diagnostics: dict[str, object] | None = Field(
        None, description="leave-one-example-out accuracy of vanilla, attn_pure and agd over "
        "the calibration instances, bootstrap spread of B (docs/calibration.md: Online calibration)"
    )
    per_n: list[CalibratedN] | None = Field(
        None,
        description="with `n` in the request: every N calibrated, ascending (the top "
        "level then describes the largest N, and forward_passes is the total)",
    )


# ---------------------------------------------------------------------------- profiles
class ProfileVersion(BaseModel):
    """One kept version of a profile."""

    version: int = Field(description="version number (1, 2, ...)")
    created_at: datetime | None = Field(description="when it was stored (UTC)")
    num_examples: int = Field(description="M, calibration examples used")
    current: bool = Field(description="whether retrieval uses this version now")


class ProfileEntry(BaseModel):
    """One (label scheme, N) of a profile name with its kept versions."""

    labels: str = Field(description="label scheme name")
    n: int = Field(description="number of images N")
    current_version: int = Field(description="the version retrieval uses")
    created_at: datetime | None = Field(description="when the current version was stored (UTC)")
    num_examples: int = Field(description="M of the current version")
    compatible: bool = Field(description="its fingerprint matches the running engine")
    versions: list[ProfileVersion] = Field(
        default_factory=list, description="kept versions (GET /v1/profiles/{name} only)"
    )
    online: dict[str, object] | None = Field(
        None, description="online calibration (GET /v1/profiles/{name} only): feedback "
        "counts, raw position drift, the last refresh decision"
    )


class ProfileSummary(BaseModel):
    """One profile name of the running model."""

    name: str = Field(description="profile name")
    model: str = Field(description="the running model's id")
    entries: list[ProfileEntry] = Field(description="one per (label scheme, N) calibrated")


class ProfileList(BaseModel):
    """Every profile of the running model."""

    model: str = Field(description="the running model's id")
    profiles: list[ProfileSummary] = Field(description="profiles by name")


class ProfileDeleted(BaseModel):
    """A profile (labels, N) deleted with every version."""

    name: str = Field(description="profile name")
    labels: str = Field(description="label scheme name")
    n: int = Field(description="number of images N")
    deleted: bool = Field(description="always true (a missing profile answers 404)")


class ProfileRolledBack(BaseModel):
    """A rollback: which version is current now, and which was before."""

    name: str = Field(description="profile name")
    labels: str = Field(description="label scheme name")
    n: int = Field(description="number of images N")
    version: int = Field(description="the version now current")
    previous_version: int = Field(description="the version that was current before")


# ---------------------------------------------------------------------------- online
class FeedbackRequest(_Strict):
    """Which candidate of an earlier retrieval was the right one."""

    request_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/+=-]+$",
                            description="the `request_id` of the retrieve response")
    answer: int = Field(ge=0, lt=MAX_N, description="0-based index of the correct image, in "
                        "the order the retrieval was sent")  # fmt: skip


class FeedbackResponse(BaseModel):
    """What the feedback did (idempotent: a repeat answers ``counted: false``)."""

    request_id: str = Field(description="the request the feedback is for")
    counted: bool = Field(description="true the first time; false for a repeat (not re-counted)")
    answer: int = Field(description="the answer on record (the first one sent)")
    profile: str = Field(description="the profile the feedback feeds")
    labels: str = Field(description="its label scheme")
    n: int = Field(description="its N")
    held_out: bool = Field(description="kept aside to judge refreshes (the server's random "
                           "draw, 1 in 5, made when the retrieval was served)")  # fmt: skip
    refresh: dict[str, object] | None = Field(
        None, description="the automatic refresh this feedback triggered "
        "(LAD_FEEDBACK_REFRESH_EVERY), if any"
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
        None, description="held-out accuracy of vanilla, attn_pure and agd with the live and "
        "the refreshed calibration, and the offline calibration's diagnostics"
    )


# ---------------------------------------------------------------------------- health
class Health(BaseModel):
    """Liveness: the process answers."""

    status: Literal["ok"] = Field("ok", description="always ok")


class Readiness(BaseModel):
    """200 whenever the model can answer retrieve; ``status`` is ``degraded`` while the store
    is unreachable or refuses writes (retrieval serves the cached profiles, admin routes
    answer 503)."""

    ready: bool = Field(description="the model is loaded and its worker runs")
    status: Literal["ok", "degraded", "not_ready"] = Field(
        "ok", description="ok; degraded while the store is unreachable or refuses writes "
        "(store.writes: failing); not_ready"
    )
    model: dict[str, object] = Field(
        description="loaded, worker_running, model_id, revision, dtype, device, "
        "attention_backend, layers"
    )
    store: dict[str, object] = Field(description="the profile store's health (backend, status, "
                                     "writes: ok, failing or unknown, ...)")  # fmt: skip
    queue: dict[str, int] = Field(description="depth, max_queue, max_batch_size")


class ErrorDetail(BaseModel):
    """What went wrong, for a program (code) and for a person (message)."""

    code: Literal[tuple(cls.code for cls in ERRORS)] = Field(  # type: ignore[valid-type]
        description="the stable cause (docs/api.md: Limits and errors)"
    )
    message: str = Field(description="for a person: what happened and what to do; never parsed")
    request_id: str | None = Field(
        description="the X-Request-ID of the request (sent, or generated); the server log "
        "has the details under it"
    )


class ErrorResponse(BaseModel):
    """The one error envelope of every error answer."""

    error: ErrorDetail = Field(description="the error")


# ---------------------------------------------------------------------------- rerank
RERANK_EXAMPLE: dict[str, object] = {
    "query": "a small green square", "documents": list(EXAMPLE_IMAGES), "top_n": 2,
    "method": "vanilla", "seed": 7,
}  # fmt: skip


class RerankOptions(_Strict):
    """How to rerank (shared by the JSON and the multipart encodings of POST /v1/rerank)."""

    top_n: int | None = Field(
        None, ge=1, le=MAX_N, description="results to return; the best top_n of each window "
        "advance (the winner and, for top_n > 1, runners-up). Unset: every document is "
        "returned, ranked, with only window winners advancing (the cheapest tournament)",
    )
    method: Method = Field("agd", description=f"one of {', '.join(METHODS)}; agd is the default")
    profile: str = Field("default", pattern=NAME_PATTERN, description="calibration profile name")
    labels: str = Field("digits", pattern="^(" + "|".join(SCHEMES) + ")$",
                        description="label scheme name (windows vary in N: no custom lists)")
    window: int | None = Field(
        None, ge=2, le=MAX_N, description="largest window (N per prompt); default: the "
        "largest N the profile is calibrated for (LAD_MAX_IMAGES for methods without one)",
    )
    seed: int | None = Field(
        None, ge=0, le=2**32 - 1, description="seed of the window assignment (same seed, "
        "same documents: same windows); default: a fresh one, returned in meta",
    )


class RerankRequest(RerankOptions):
    """A query and its candidate images, in the shape common rerank APIs use."""

    model_config = ConfigDict(json_schema_extra={"examples": [RERANK_EXAMPLE]})

    query: str = Field(min_length=1, max_length=100_000, description="the caption to match")
    documents: list[str] = Field(
        min_length=2, max_length=MAX_N, description="2..LAD_MAX_RERANK_CANDIDATES candidate "
        "images, each a data:image/...;base64, URL or bare base64",
    )


class RerankResult(BaseModel):
    """One document of the ranking."""

    index: int = Field(description="0-based index into `documents`")
    relevance_score: float = Field(
        description="its debiased probability in the last window it played (comparable "
        "within a window; the order of `results` is the ranking)"
    )


class RerankMeta(BaseModel):
    """How the ranking was made."""

    method: str = Field(description="the method applied in every window")
    model: str = Field(description="the model id that answered")
    profile: dict[str, int] | None = Field(
        None, description="N -> the profile version used for windows of N (null: no profile)"
    )
    window: int = Field(description="the largest window size")
    seed: int = Field(description="the seed of the window assignment")
    rounds: int = Field(description="tournament rounds (1: every document in one window)")
    windows: list[list[int]] = Field(description="window sizes of each round")
    forward_passes: int = Field(description="forward passes spent (perm_avg: N per window)")
    timings_ms: dict[str, float] = Field(description="decode, forward (all rounds), total")


class RerankResponse(BaseModel):
    results: list[RerankResult] = Field(description="top_n documents, best first")
    meta: RerankMeta = Field(description="how the ranking was made and what it cost")
