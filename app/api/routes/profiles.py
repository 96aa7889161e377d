"""Calibration profiles of the running model: list, inspect, delete, roll back."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app.api.deps import ServiceDep
from app.api.registry import register
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

router = APIRouter(tags=["profiles"])

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


@register(router, "list_profiles")
async def list_profiles(service: ServiceDep) -> ProfileList:
    return await service.profiles.list()


@register(router, "get_profile")
async def get_profile(name: NameParam, service: ServiceDep) -> ProfileSummary:
    return await service.online.annotate(await service.profiles.detail(name))


@register(router, "delete_profile")
async def delete_profile(name: NameParam, n: NParam, service: ServiceDep,
                         labels: LabelsParam = "digits") -> ProfileDeleted:
    deleted = await service.profiles.delete(name, labels, n)
    await service.online.forget(name, labels, n)
    return deleted


@register(router, "rollback_profile")
async def rollback_profile(name: NameParam, n: NParam, service: ServiceDep,
                           labels: LabelsParam = "digits",
                           version: VersionParam = None) -> ProfileRolledBack:
    return await service.profiles.rollback(name, labels, n, version)
