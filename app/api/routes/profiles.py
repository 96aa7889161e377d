"""Calibration profiles of the running model: list, inspect, delete, roll back."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app.api.deps import ProfilesDep
from app.api.registry import register
from app.api.route_table import DELETE_PROFILE, GET_PROFILE, LIST_PROFILES, ROLLBACK_PROFILE
from app.engine.labels import STORED_TEXT_PATTERN
from lad_client.types import (
    MAX_VERSION,
    ProfileDeleted,
    ProfileList,
    ProfileRolledBack,
    ProfileSummary,
)
from lad_client.vocabulary import MAX_N, NAME_PATTERN

router = APIRouter(tags=["profiles"])

NameParam = Annotated[
    str, Path(pattern=NAME_PATTERN, description="profile name", examples=["default"])
]
NParam = Annotated[
    int, Query(ge=2, le=MAX_N, description="number of images N the profile is for", examples=[3])
]
LabelsParam = Annotated[
    str,
    Query(
        pattern=STORED_TEXT_PATTERN,
        max_length=MAX_N * 33 + 2,
        examples=["digits"],
        description='label scheme: "digits", "upper", ..., "custom:<hash>" as listed, or a '
        "comma list (or JSON list) of the N labels",
    ),
]
VersionParam = Annotated[
    int | None,
    Query(
        ge=1,
        le=MAX_VERSION,
        examples=[1],
        description="target version (default: the newest kept one before the current)",
    ),
]


@register(router, LIST_PROFILES)
async def list_profiles(handler: ProfilesDep) -> ProfileList:
    return await handler.list()


@register(router, GET_PROFILE)
async def get_profile(name: NameParam, handler: ProfilesDep) -> ProfileSummary:
    return await handler.detail(name)


@register(router, DELETE_PROFILE)
async def delete_profile(
    name: NameParam, n: NParam, handler: ProfilesDep, labels: LabelsParam = "digits"
) -> ProfileDeleted:
    return await handler.delete(name, labels, n)


@register(router, ROLLBACK_PROFILE)
async def rollback_profile(
    name: NameParam,
    n: NParam,
    handler: ProfilesDep,
    labels: LabelsParam = "digits",
    version: VersionParam = None,
) -> ProfileRolledBack:
    return await handler.rollback(name, labels, n, version)
