"""POST /v1/calibrate: M examples with known answers in, a new profile version out."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from lad_client.types.common import (
    EXAMPLE_IMAGES,
    LABELS_DESCRIPTION,
    ImageList,
    LabelsValue,
    Strict,
)
from lad_client.vocabulary import MAX_N, NAME_PATTERN

MAX_CALIBRATION_EXAMPLES = 64
RECOMMENDED_CALIBRATION_EXAMPLES = 5
CALIBRATE_EXAMPLE: dict[str, object] = {
    "profile": "default",
    "labels": "digits",
    "examples": [{"query": "a small green square", "images": list(EXAMPLE_IMAGES), "answer": 1}],
}


class CalibrationExample(Strict):
    """One calibration example: a query, its N images and which one matches."""

    query: str = Field(
        min_length=1, max_length=100_000, description="the caption of the matching image"
    )
    images: ImageList
    answer: int = Field(ge=0, lt=MAX_N, description="0-based index of the matching image")


class CalibrateRequest(Strict):
    """M examples with known answers; every example must have the same number of images N."""

    examples: list[CalibrationExample] = Field(
        min_length=1,
        max_length=MAX_CALIBRATION_EXAMPLES,
        description=f"1..{MAX_CALIBRATION_EXAMPLES} examples; "
        f"{RECOMMENDED_CALIBRATION_EXAMPLES} is the recommended (and the paper's) setting",
    )
    profile: str = Field("default", pattern=NAME_PATTERN, description="profile name to calibrate")
    labels: LabelsValue = Field("digits", description=LABELS_DESCRIPTION)
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
        None,
        description="leave-one-example-out accuracy of vanilla, attn_pure and agd over "
        "the calibration instances, bootstrap spread of B "
        "(docs/calibration.md: Online calibration)",
    )
    per_n: list[CalibratedN] | None = Field(
        None,
        description="with `n` in the request: every N calibrated, ascending (the top "
        "level then describes the largest N, and forward_passes is the total)",
    )
