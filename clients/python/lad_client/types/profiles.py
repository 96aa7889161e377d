"""GET / DELETE /v1/profiles, rollback: the stored calibration profiles and their versions."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


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
        None,
        description="online calibration (GET /v1/profiles/{name} only): feedback "
        "counts, raw position drift, the last refresh decision",
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
