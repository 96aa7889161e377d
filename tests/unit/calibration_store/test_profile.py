"""The Profile schema: shapes, finiteness, schema versions, fingerprints, JSON round trip."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from calibration_store import Fingerprint, Profile, ProfileKey, UnknownSchemaVersion

FP = {
    "model_id": "org/m",
    "model_revision": "r1",
    "dtype": "bfloat16",
    "attention_backend": "sdpa",
    "prompt_hash": "h" * 8,
    "label_scheme": "digits",
    "n": 3,
}


def build(**overrides: Any) -> Profile:
    args: dict[str, Any] = {
        "name": "default",
        "fingerprint": FP,
        "layers": [5, 6],
        "bias_matrix": np.arange(9.0).reshape(3, 3) / 7,
        "attention_prior": np.full((2, 3), 0.1),
        "num_examples": 5,
        "num_forward_passes": 15,
        "hyperparameters": {"top_k": 2, "tau": 5.0, "eps": 1e-20, "variant": "reference"},
    }
    args.update(overrides)
    return Profile.create(**args)


def test_json_round_trip_is_exact() -> None:
    stored = build().stored_as(3)
    again = Profile.from_json(stored.to_json())
    assert again == stored
    assert again.created_at is not None and again.created_at.tzinfo is not None
    assert np.array_equal(again.bias_matrix_array(), np.arange(9.0).reshape(3, 3) / 7)
    assert again.attention_prior_array().shape == (2, 3)
    assert json.loads(stored.to_json())["schema_version"] == 1


@pytest.mark.parametrize("found", [2, 0, None, "1", True])
def test_unknown_or_missing_schema_version(found: Any) -> None:
    doc = build().to_dict()
    if found is None:
        del doc["schema_version"]
    else:
        doc["schema_version"] = found
    with pytest.raises(UnknownSchemaVersion) as info:
        Profile.from_json(json.dumps(doc))
    assert isinstance(info.value, ValueError)
    assert "schema_version" in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"bias_matrix": np.zeros((3, 2))}, "bias_matrix must be 3 x 3"),
        ({"bias_matrix": np.zeros((2, 2))}, "bias_matrix must be 3 x 3"),
        ({"attention_prior": np.ones((3, 3))}, "attention_prior must be"),
        ({"layers": [4, 4], "attention_prior": np.ones((2, 3))}, "distinct"),
        ({"bias_matrix": np.full((3, 3), np.nan)}, "non-finite"),
        ({"attention_prior": np.full((2, 3), np.inf)}, "non-finite"),
        ({"attention_prior": -np.ones((2, 3))}, "negative"),
        ({"hyperparameters": {"tau": float("nan")}}, "finite JSON"),
        ({"name": "no spaces/or slashes"}, "pattern"),
    ],
)
def test_inconsistent_profiles_are_rejected(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        build(**overrides)


def test_created_at_is_normalised_to_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    aware = build().stored_as(1, datetime(2025, 1, 1, 12, tzinfo=plus_two))
    assert aware.created_at == datetime(2025, 1, 1, 10, tzinfo=UTC)
    assert aware.created_at.utcoffset() == timedelta(0)
    naive = build().stored_as(1, datetime(2025, 1, 1, 12))
    assert naive.created_at == datetime(2025, 1, 1, 12, tzinfo=UTC)


def test_key_and_fingerprint() -> None:
    profile = build()
    assert profile.key == ProfileKey(model_id="org/m", name="default", label_scheme="digits", n=3)
    assert hash(profile.key) == hash(ProfileKey(**profile.key.model_dump()))
    assert profile.fingerprint == Fingerprint(**FP)

    @dataclass(frozen=True)
    class RunnerFingerprint:  # what a runner may hand over
        model_id: str
        model_revision: str | None
        dtype: str
        attention_backend: str
        prompt_hash: str
        label_scheme: str
        n: int

    same = RunnerFingerprint(**FP)
    assert profile.fingerprint.mismatches(same) == {}
    other = RunnerFingerprint(**{**FP, "dtype": "float32", "prompt_hash": "x"})
    assert profile.fingerprint.mismatches(other) == {
        "dtype": ("bfloat16", "float32"),
        "prompt_hash": ("h" * 8, "x"),
    }


def test_profiles_are_immutable() -> None:
    profile = build()
    with pytest.raises(ValidationError):
        profile.version = 4  # type: ignore[misc]


def test_sink_layers_are_stored_and_old_profiles_still_load() -> None:
    profile = build(sink_layers=[5])
    assert Profile.from_json(profile.to_json()).sink_layers == [5]
    old = build().to_dict()
    del old["sink_layers"]  # a document written before the sink guard existed
    assert Profile.from_dict(old).sink_layers == []
    with pytest.raises(ValidationError, match="subset of layers"):
        build(sink_layers=[9])


def test_calibration_position_share_is_optional_and_checked() -> None:
    old = build().stored_as(1).to_dict()
    del old["calibration_position_share"]  # a profile written before the field existed
    assert Profile.from_dict(old).calibration_position_share is None
    stored = build(calibration_position_share=np.array([0.5, 0.25, 0.25])).stored_as(1)
    assert Profile.from_json(stored.to_json()).calibration_position_share == [0.5, 0.25, 0.25]
    for bad in ([0.5, 0.5], [0.5, 0.25, 0.5], [1.5, -0.25, -0.25], [float("nan"), 0.5, 0.5]):
        with pytest.raises(ValidationError, match="calibration_position_share"):
            build(calibration_position_share=bad)


def test_the_capture_is_fingerprinted_and_old_profiles_read_as_sdpa() -> None:
    """A profile written before the capture was recorded (no "capture" key) loads as an SDPA
    capture's, and a profile of one capture mismatches an engine on the other."""
    doc = build().to_dict()
    assert doc["capture"] == "sdpa"
    del doc["capture"]
    old = Profile.from_json(json.dumps(doc))
    assert old.capture == "sdpa" and old.fingerprint == Fingerprint.of(FP)
    engine = Fingerprint.of({**FP, "capture": "eager_hook"})
    assert old.fingerprint.mismatches(engine) == {"capture": ("sdpa", "eager_hook")}
    hooked = build(fingerprint=engine)
    assert Profile.from_json(hooked.to_json()).capture == "eager_hook"
