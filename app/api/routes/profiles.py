"""Calibration profiles of the running model: list, inspect, delete, roll back."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app.api.deps import AdminAuth, ServiceDep
from app.schemas import (
    ErrorResponse,
    ProfileDeleted,
    ProfileList,
    ProfileRolledBack,
    ProfileSummary,
)
from calibration_store.profile import NAME_PATTERN

router = APIRouter(prefix="/v1/profiles", tags=["profiles"])

NameParam = Annotated[str, Path(pattern=NAME_PATTERN, description="profile name")]
NParam = Annotated[int, Query(ge=1, description="number of images N the profile is for")]
LabelsParam = Annotated[
    str, Query(description='label scheme: "digits", "upper", ..., "custom:<hash>" as listed, '
               "or a comma list of labels")
]
VersionParam = Annotated[
    int | None,
    Query(ge=1, description="target version (default: the newest kept one before the current)"),
]
_ERRORS = {c: {"model": ErrorResponse} for c in (401, 403, 404, 409, 422, 503)}


@router.get("", response_model=ProfileList, summary="Every profile of the running model")
async def list_profiles(service: ServiceDep) -> ProfileList:
    return await service.profiles.list()


@router.get("/{name}", response_model=ProfileSummary, responses=_ERRORS,
            summary="One profile: every (labels, N) with its kept versions")
async def get_profile(name: NameParam, service: ServiceDep) -> ProfileSummary:
    return await service.profiles.detail(name)


@router.delete("/{name}", response_model=ProfileDeleted, dependencies=[AdminAuth],
               responses=_ERRORS, summary="Delete every version of a profile for one N")
async def delete_profile(name: NameParam, n: NParam, service: ServiceDep,
                         labels: LabelsParam = "digits") -> ProfileDeleted:
    return await service.profiles.delete(name, labels, n)


@router.post("/{name}/rollback", response_model=ProfileRolledBack, dependencies=[AdminAuth],
             responses=_ERRORS, summary="Make the previous kept version current again")
async def rollback_profile(name: NameParam, n: NParam, service: ServiceDep,
                           labels: LabelsParam = "digits",
                           version: VersionParam = None) -> ProfileRolledBack:
    return await service.profiles.rollback(name, labels, n, version)
