"""POST /v1/rerank: a query and many candidate images, ranked by windowed tournament."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from lad_client.types.common import EXAMPLE_IMAGES, Strict
from lad_client.vocabulary import MAX_N, METHODS, NAME_PATTERN, SCHEMES, Method

RERANK_EXAMPLE: dict[str, object] = {
    "query": "a small green square",
    "documents": list(EXAMPLE_IMAGES),
    "top_n": 2,
    "method": "vanilla",
    "seed": 7,
}


class RerankOptions(Strict):
    """How to rerank (shared by the JSON and the multipart encodings of POST /v1/rerank)."""

    top_n: int | None = Field(
        None,
        ge=1,
        le=MAX_N,
        description="results to return; the best top_n of each window "
        "advance (the winner and, for top_n > 1, runners-up). Unset: every document is "
        "returned, ranked, with only window winners advancing (the cheapest tournament)",
    )
    method: Method = Field("agd", description=f"one of {', '.join(METHODS)}; agd is the default")
    profile: str = Field("default", pattern=NAME_PATTERN, description="calibration profile name")
    labels: str = Field(
        "digits",
        pattern="^(" + "|".join(SCHEMES) + ")$",
        description="label scheme name (windows vary in N: no custom lists)",
    )
    window: int | None = Field(
        None,
        ge=2,
        le=MAX_N,
        description="largest window (N per prompt); default: the "
        "largest N the profile is calibrated for (LAD_MAX_IMAGES for methods without one)",
    )
    seed: int | None = Field(
        None,
        ge=0,
        le=2**32 - 1,
        description="seed of the window assignment (same seed, "
        "same documents: same windows); default: a fresh one, returned in meta",
    )


class RerankRequest(RerankOptions):
    """A query and its candidate images, in the shape common rerank APIs use."""

    model_config = ConfigDict(json_schema_extra={"examples": [RERANK_EXAMPLE]})

    query: str = Field(min_length=1, max_length=100_000, description="the caption to match")
    documents: list[str] = Field(
        min_length=2,
        max_length=MAX_N,
        description="2..LAD_MAX_RERANK_CANDIDATES candidate "
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
