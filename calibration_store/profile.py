"""The calibration profile (DESIGN §2.3) as a versioned, JSON-only pydantic schema.

A profile holds the conditional bias matrix B (N x N) and the attention prior P
(|Λ| x N) estimated from M calibration examples, together with the fingerprint of
the engine that produced them. Stores key profiles by `ProfileKey` (the model's served
name, profile name, label scheme, N); the full `Fingerprint` (revision, the model's
config and weights hashes, dtype, attention backend, prompt hash too) is stored with every
profile so that the service can refuse to apply a profile calibrated under a different
model or engine configuration.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lad_client.vocabulary import NAME_PATTERN

CURRENT_SCHEMA_VERSION: Final[int] = 1
SUPPORTED_SCHEMA_VERSIONS: Final[frozenset[int]] = frozenset({1})


class UnknownSchemaVersion(ValueError):
    """A stored profile was written with a schema this code does not understand."""

    def __init__(self, found: object) -> None:
        supported = ", ".join(str(v) for v in sorted(SUPPORTED_SCHEMA_VERSIONS))
        super().__init__(
            f"unknown profile schema_version {found!r}; this build reads {supported} "
            "(a newer release wrote it? upgrade, or recalibrate)"
        )
        self.found = found


class ProfileKey(BaseModel):
    """What a store indexes profiles by: one profile per model, name, label scheme and N."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    model_id: str = Field(min_length=1, max_length=512)
    name: str = Field(pattern=NAME_PATTERN)
    label_scheme: str = Field(min_length=1, max_length=2048)
    n: int = Field(ge=1, le=4096)

    def __str__(self) -> str:
        return f"{self.model_id}/{self.name}/{self.label_scheme}/N={self.n}"


def _identity(what: str) -> Any:
    """A field of what the model is (app.engine.identity)."""
    return Field(
        None,
        max_length=128,
        description=f"what the model is: a hash of its {what} (app.engine.identity); absent "
        "in profiles written before it was recorded, and then not compared",
    )


class _FingerprintFields(BaseModel):
    """The fields of an engine fingerprint, shared by Fingerprint and (flat) by Profile."""

    # model_id and model_revision are the wire names; pydantic < 2.10 warns on "model_" fields
    model_config = ConfigDict(protected_namespaces=())

    model_id: str = Field(min_length=1, max_length=512)
    model_revision: str | None = None
    dtype: str = Field(min_length=1)
    attention_backend: str = Field(min_length=1)
    capture: str = Field(
        "sdpa",
        min_length=1,
        description='how the attention rows were captured: "sdpa" (inside the SDPA call) or '
        '"eager_hook" (per-layer hooks on eager attention); profiles written before the '
        "field existed were all sdpa",
    )
    prompt_hash: str = Field(min_length=1)
    label_scheme: str = Field(min_length=1, max_length=2048)
    n: int = Field(ge=1, le=4096)
    config_hash: str | None = _identity("configuration")
    weights_hash: str | None = _identity("weights")


IDENTITY_FIELDS: Final = ("config_hash", "weights_hash")
"""Fingerprint fields compared only when both sides recorded them (older profiles have none:
they keep serving the model they are keyed by, as before the fields existed)."""


class Fingerprint(_FingerprintFields):
    """The engine configuration a profile is only valid for (Runner.fingerprint)."""

    model_config = ConfigDict(frozen=True, extra="forbid", from_attributes=True)

    @classmethod
    def of(cls, obj: Fingerprint | dict[str, Any]) -> Fingerprint:
        """Accept a Fingerprint or its fields as a dict."""
        return obj if isinstance(obj, cls) else cls.model_validate(obj)

    def mismatches(self, other: Any) -> dict[str, tuple[Any, Any]]:
        """Fields that differ, as {field: (self's value, other's value)}; empty when equal."""
        theirs = Fingerprint.of(other)
        diff = {
            f: (getattr(self, f), getattr(theirs, f))
            for f in type(self).model_fields
            if getattr(self, f) != getattr(theirs, f)
        }
        for f in IDENTITY_FIELDS:
            if None in diff.get(f, ()):
                del diff[f]
        return diff


def _to_utc(t: datetime) -> datetime:
    """Naive times are taken as UTC; aware ones are converted to it."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _as_lists(value: Any) -> Any:
    """Let callers pass numpy arrays; the schema itself stores plain JSON lists."""
    return value.tolist() if isinstance(value, np.ndarray) else value


class Profile(_FingerprintFields):
    """One calibration: B, P, Λ and how they were obtained. Stores assign version/created_at."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = CURRENT_SCHEMA_VERSION
    name: str = Field(pattern=NAME_PATTERN)
    # the fingerprint fields are inherited (flat, so the JSON document reads on its own)
    # the estimates
    layers: list[int] = Field(min_length=1)
    bias_matrix: list[list[float]]
    attention_prior: list[list[float]]
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    sink_layers: list[int] = Field(
        default_factory=list,
        description="decoder layers of `layers` whose prior starves a position (DESIGN §2.4 "
        "sink guard); absent in profiles written before the guard existed",
    )
    num_examples: int = Field(ge=1)
    num_forward_passes: int = Field(ge=0)
    # set by the store on put()
    version: int = Field(default=0, ge=0)
    created_at: datetime | None = None
    notes: str | None = Field(default=None, max_length=4096)
    calibration_position_share: list[float] | None = Field(
        default=None,
        description="share of the M x N calibration passes whose raw argmax (the model's own "
        "choice) was each position 0..N-1; the reference of the raw position-drift alert. "
        "Absent in profiles written before it was recorded.",
    )

    calibration_statistics: dict[str, Any] | None = Field(
        default=None,
        description="the offline calibration's sums and counts (row_sums, row_counts, "
        "prior_sums, prior_count; DESIGN §2.8) that online refresh blends feedback into",
    )
    provenance: dict[str, Any] | None = Field(
        default=None,
        description="how this version was derived: offline, or refreshed from feedback "
        "(feedback count, window, held-out accuracies)",
    )
    diagnostics: dict[str, Any] | None = Field(
        default=None,
        description="calibration diagnostics: leave-one-example-out accuracy per method, "
        "bootstrap spread of B",
    )

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, v: int) -> int:
        if v not in SUPPORTED_SCHEMA_VERSIONS:
            raise UnknownSchemaVersion(v)
        return v

    @field_validator("bias_matrix", "attention_prior", "calibration_position_share", mode="before")
    @classmethod
    def _arrays_to_lists(cls, v: Any) -> Any:
        return _as_lists(v)

    @field_validator("layers", mode="before")
    @classmethod
    def _layers_to_list(cls, v: Any) -> Any:
        return [int(x) for x in v] if isinstance(v, np.ndarray | tuple) else v

    @field_validator("hyperparameters", "calibration_statistics", "provenance", "diagnostics")
    @classmethod
    def _json_hyperparameters(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        try:
            json.dumps(v, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"must hold finite JSON values only: {exc}") from exc
        return v

    @field_validator("created_at")
    @classmethod
    def _utc(cls, v: datetime | None) -> datetime | None:
        return None if v is None else _to_utc(v)

    @model_validator(mode="after")
    def _consistent_shapes(self) -> Profile:
        n = self.n
        if len(self.layers) != len(set(self.layers)) or any(layer < 0 for layer in self.layers):
            raise ValueError(f"layers must be distinct non-negative indices, got {self.layers}")
        if len(self.bias_matrix) != n or any(len(row) != n for row in self.bias_matrix):
            raise ValueError(f"bias_matrix must be {n} x {n}")
        if len(self.attention_prior) != len(self.layers) or any(
            len(row) != n for row in self.attention_prior
        ):
            raise ValueError(f"attention_prior must be |layers| x N = {len(self.layers)} x {n}")
        for field in ("bias_matrix", "attention_prior"):
            if not all(math.isfinite(x) for row in getattr(self, field) for x in row):
                raise ValueError(f"{field} holds a non-finite number")
        if any(x < 0 for row in self.attention_prior for x in row):
            raise ValueError("attention_prior holds a negative attention mass")
        if not set(self.sink_layers) <= set(self.layers):
            raise ValueError(f"sink_layers {self.sink_layers} must be a subset of layers")
        self._check_position_share()
        return self

    def _check_position_share(self) -> None:
        share = self.calibration_position_share
        if share is None:
            return
        if len(share) != self.n:
            raise ValueError(f"calibration_position_share must have N = {self.n} entries")
        if not all(math.isfinite(x) and x >= 0 for x in share) or abs(sum(share) - 1) > 1e-6:
            raise ValueError("calibration_position_share must be non-negative and sum to 1")

    # ----------------------------------------------------------------- views
    @property
    def key(self) -> ProfileKey:
        return ProfileKey(
            model_id=self.model_id, name=self.name, label_scheme=self.label_scheme, n=self.n
        )

    @property
    def fingerprint(self) -> Fingerprint:
        return Fingerprint.model_validate(self, from_attributes=True)

    def bias_matrix_array(self) -> np.ndarray:
        """B as a float64 (N, N) array, rows = GT position t, columns = position j."""
        return np.asarray(self.bias_matrix, dtype=np.float64)

    def attention_prior_array(self) -> np.ndarray:
        """P as a float64 (|Λ|, N) array, rows in the order of `layers`."""
        return np.asarray(self.attention_prior, dtype=np.float64)

    # ------------------------------------------------------------ building
    @classmethod
    def create(
        cls,
        *,
        name: str,
        fingerprint: Any,
        layers: Any,
        bias_matrix: Any,
        attention_prior: Any,
        num_examples: int,
        num_forward_passes: int,
        hyperparameters: dict[str, Any] | None = None,
        notes: str | None = None,
        sink_layers: Any = (),
        calibration_position_share: Any = None,
        **online: Any,
    ) -> Profile:
        """Build an unstored profile from a runner fingerprint and the estimates."""
        fp = Fingerprint.of(fingerprint)
        return cls(
            name=name,
            **fp.model_dump(),
            layers=layers,
            bias_matrix=bias_matrix,
            attention_prior=attention_prior,
            num_examples=num_examples,
            num_forward_passes=num_forward_passes,
            hyperparameters=hyperparameters or {},
            notes=notes,
            sink_layers=[int(x) for x in sink_layers],
            calibration_position_share=calibration_position_share,
            **online,
        )

    def stored_as(self, version: int, created_at: datetime | None = None) -> Profile:
        """The copy a store keeps: version assigned, created now (UTC)."""
        if version < 1:
            raise ValueError(f"stored versions start at 1, got {version}")
        stamp = _to_utc(created_at) if created_at is not None else datetime.now(UTC)
        return self.model_copy(update={"version": version, "created_at": stamp})

    # --------------------------------------------------------------- JSON
    def to_json(self) -> str:
        return self.model_dump_json()

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        """Validate a decoded document; an unknown or missing schema_version is its own error."""
        if not isinstance(data, dict):
            raise ValueError("a profile document must be a JSON object")
        found = data.get("schema_version")
        if found not in SUPPORTED_SCHEMA_VERSIONS or isinstance(found, bool):
            raise UnknownSchemaVersion(found)
        return cls.model_validate(data)

    @classmethod
    def from_json(cls, text: str | bytes) -> Profile:
        return cls.from_dict(json.loads(text))
