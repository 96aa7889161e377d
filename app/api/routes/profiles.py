"""Calibration profiles of the running model: list, inspect, delete, roll back."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app.api.deps import AdminAuth, ServiceDep
from app.api.route_errors import error_responses
from app.engine.labels import SCHEMES
from app.settings import MAX_N
from calibration_store.profile import NAME_PATTERN
from lad_client.types import (
    MAX_VERSION,
    ProfileDeleted,
    ProfileList,
    ProfileRolledBack,
    ProfileSummary,
)

router = APIRouter(prefix="/v1/profiles", tags=["profiles"])

LABELS_PATTERN = (
    "^(" + "|".join(SCHEMES) + r"|custom:[0-9a-f]{8})$|^\[.*\]$|^[^,]+(,[^,]+)+$"
)
"""A scheme name, a stored ``custom:<hash>`` as listed, or a JSON / comma list of labels."""

NameParam = Annotated[
    str, Path(pattern=NAME_PATTERN, description="profile name", examples=["default"])
]
NParam = Annotated[
    int, Query(ge=2, le=MAX_N, description="number of images N the profile is for", examples=[3])
]
LabelsParam = Annotated[
    str,
    Query(
        pattern=LABELS_PATTERN, max_length=MAX_N * 33 + 2, examples=["digits"],
        description='label scheme: "digits", "upper", ..., "custom:<hash>" as listed, or a '
        "comma list (or JSON list) of the N labels",
    ),
]  # fmt: skip
VersionParam = Annotated[
    int | None,
    Query(ge=1, le=MAX_VERSION, examples=[1],
          description="target version (default: the newest kept one before the current)"),
]  # fmt: skip


@router.get("", response_model=ProfileList, responses=error_responses("GET", "/v1/profiles"),
            summary="Every profile of the running model")
async def list_profiles(service: ServiceDep) -> ProfileList:
    return await service.profiles.list()


@router.get("/{name}", response_model=ProfileSummary,
            responses=error_responses("GET", "/v1/profiles/{name}"),
            summary="One profile: every (labels, N) with its kept versions")
async def get_profile(name: NameParam, service: ServiceDep) -> ProfileSummary:
    return await service.online.annotate(await service.profiles.detail(name))


@router.delete("/{name}", response_model=ProfileDeleted, dependencies=[AdminAuth],
               responses=error_responses("DELETE", "/v1/profiles/{name}"),
               summary="Delete every version of a profile for one N")
async def delete_profile(name: NameParam, n: NParam, service: ServiceDep,
                         labels: LabelsParam = "digits") -> ProfileDeleted:
    deleted = await service.profiles.delete(name, labels, n)
    await service.online.forget(name, labels, n)
    return deleted


@router.post("/{name}/rollback", response_model=ProfileRolledBack, dependencies=[AdminAuth],
             responses=error_responses("POST", "/v1/profiles/{name}/rollback"),
             summary="Make the previous kept version current again")
async def rollback_profile(name: NameParam, n: NParam, service: ServiceDep,
                           labels: LabelsParam = "digits",
                           version: VersionParam = None) -> ProfileRolledBack:
    return await service.profiles.rollback(name, labels, n, version)
