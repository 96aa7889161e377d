"""Calibration profiles of the running model: list, inspect, delete, roll back."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app import errors
from app.api.deps import AdminAuth, ServiceDep
from app.api.openapi import ADMIN, SERVICE, error_responses
from app.engine.labels import SCHEMES
from app.schemas import (
    MAX_VERSION,
    ProfileDeleted,
    ProfileList,
    ProfileRolledBack,
    ProfileSummary,
)
from app.settings import MAX_N
from calibration_store.profile import NAME_PATTERN

router = APIRouter(prefix="/v1/profiles", tags=["profiles"])

LABELS_PATTERN = (
    "^(" + "|".join(SCHEMES) + r"|custom:[0-9a-f]{8})$|^\[.*\]$|^[^,]+(,[^,]+)+$"
)
"""A scheme name, a stored ``custom:<hash>`` as listed, or a JSON / comma list of labels."""

NameParam = Annotated[str, Path(pattern=NAME_PATTERN, description="profile name")]
NParam = Annotated[
    int, Query(ge=2, le=MAX_N, description="number of images N the profile is for")
]
LabelsParam = Annotated[
    str,
    Query(
        pattern=LABELS_PATTERN, max_length=MAX_N * 33 + 2,
        description='label scheme: "digits", "upper", ..., "custom:<hash>" as listed, or a '
        "comma list (or JSON list) of the N labels",
    ),
]  # fmt: skip
VersionParam = Annotated[
    int | None,
    Query(ge=1, le=MAX_VERSION,
          description="target version (default: the newest kept one before the current)"),
]  # fmt: skip
_READ_ERRORS = error_responses(SERVICE, (errors.ProfileNotFound, errors.StoreUnavailable))
_ADMIN_ERRORS = error_responses(
    SERVICE, ADMIN, (errors.ProfileNotFound, errors.InvalidLabels, errors.NoPreviousVersion)
)


@router.get("", response_model=ProfileList, responses=error_responses(SERVICE),
            summary="Every profile of the running model")
async def list_profiles(service: ServiceDep) -> ProfileList:
    return await service.profiles.list()


@router.get("/{name}", response_model=ProfileSummary, responses=_READ_ERRORS,
            summary="One profile: every (labels, N) with its kept versions")
async def get_profile(name: NameParam, service: ServiceDep) -> ProfileSummary:
    return await service.profiles.detail(name)


@router.delete("/{name}", response_model=ProfileDeleted, dependencies=[AdminAuth],
               responses=_ADMIN_ERRORS, summary="Delete every version of a profile for one N")
async def delete_profile(name: NameParam, n: NParam, service: ServiceDep,
                         labels: LabelsParam = "digits") -> ProfileDeleted:
    return await service.profiles.delete(name, labels, n)


@router.post("/{name}/rollback", response_model=ProfileRolledBack, dependencies=[AdminAuth],
             responses=_ADMIN_ERRORS, summary="Make the previous kept version current again")
async def rollback_profile(name: NameParam, n: NParam, service: ServiceDep,
                           labels: LabelsParam = "digits",
                           version: VersionParam = None) -> ProfileRolledBack:
    return await service.profiles.rollback(name, labels, n, version)
