"""Calibration profiles of the running model: list, inspect, delete, roll back."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app import errors
from app.api.deps import AdminAuth, ServiceDep
from app.engine.labels import SCHEMES, scheme_name
from app.schemas import (
    ErrorResponse,
    ProfileDeleted,
    ProfileEntry,
    ProfileList,
    ProfileRolledBack,
    ProfileSummary,
    ProfileVersion,
)
from app.serving import Service
from calibration_store import Profile, ProfileKey
from calibration_store.profile import NAME_PATTERN

router = APIRouter(prefix="/v1/profiles", tags=["profiles"])

NameParam = Annotated[str, Path(pattern=NAME_PATTERN, description="profile name")]
NParam = Annotated[int, Query(ge=1, description="number of images N the profile is for")]
LabelsParam = Annotated[
    str, Query(description='label scheme: "digits", "upper", ..., "custom:<hash>" as listed, '
               "or a comma list of labels")
]
_ERRORS = {c: {"model": ErrorResponse} for c in (401, 403, 404, 409, 422, 503)}


def _scheme(labels: str) -> str:
    """The stored scheme name for a labels query parameter."""
    text = labels.strip()
    if text in SCHEMES or text.startswith("custom:"):
        return text
    if "," in text:
        try:
            return scheme_name([part.strip() for part in text.split(",")])
        except ValueError as exc:
            raise errors.InvalidLabels(str(exc)) from None
    raise errors.InvalidLabels(f"unknown label scheme {labels!r}; use one of {SCHEMES}")


def _not_found(key: ProfileKey) -> errors.ProfileNotFound:
    return errors.ProfileNotFound(
        f"no profile {key.name!r} with labels {key.label_scheme} and N={key.n}"
    )


def _compatible(service: Service, profile: Profile) -> bool:
    """Whether the running engine would serve this profile (labels do not enter the check)."""
    engine = service.fingerprint("digits", profile.n)
    diff = profile.fingerprint.mismatches(engine.model_copy(update={
        "label_scheme": profile.label_scheme}))
    return not diff and list(profile.layers) == list(service.runner.layers)


def _entry(service: Service, key: ProfileKey, current: Profile,
           kept: list[Profile] | None) -> ProfileEntry:
    versions = [
        ProfileVersion(version=p.version, created_at=p.created_at, num_examples=p.num_examples,
                       current=p.version == current.version)
        for p in kept or []
    ]
    return ProfileEntry(
        labels=key.label_scheme, n=key.n, current_version=current.version,
        created_at=current.created_at, num_examples=current.num_examples,
        compatible=_compatible(service, current), versions=versions,
    )


def _current(service: Service) -> dict[ProfileKey, Profile]:
    found = {}
    for key in service.store.list_keys(service.model_id):
        profile = service.store.get(key)
        if profile is not None:
            found[key] = profile
    return found


@router.get("", response_model=ProfileList, summary="Every profile of the running model")
async def list_profiles(service: ServiceDep) -> ProfileList:
    current = await service.store_call("list", _current, service)
    by_name: dict[str, list[ProfileEntry]] = {}
    for key, profile in current.items():
        by_name.setdefault(key.name, []).append(_entry(service, key, profile, None))
    return ProfileList(model=service.model_id, profiles=[
        ProfileSummary(name=name, model=service.model_id, entries=entries)
        for name, entries in sorted(by_name.items())
    ])


def _detail(service: Service, name: str) -> list[tuple[ProfileKey, Profile, list[Profile]]]:
    rows = []
    for key, current in _current(service).items():
        if key.name != name:
            continue
        kept = [service.store.get_version(key, v) for v in service.store.versions(key)]
        rows.append((key, current, [p for p in kept if p is not None]))
    return rows


@router.get("/{name}", response_model=ProfileSummary, responses=_ERRORS,
            summary="One profile: every (labels, N) with its kept versions")
async def get_profile(name: NameParam, service: ServiceDep) -> ProfileSummary:
    rows = await service.store_call("versions", _detail, service, name)
    if not rows:
        raise errors.ProfileNotFound(f"no profile named {name!r} for model {service.model_id!r}")
    return ProfileSummary(name=name, model=service.model_id,
                          entries=[_entry(service, k, c, kept) for k, c, kept in rows])


@router.delete("/{name}", response_model=ProfileDeleted, dependencies=[AdminAuth],
               responses=_ERRORS, summary="Delete every version of a profile for one N")
async def delete_profile(name: NameParam, n: NParam, service: ServiceDep,
                         labels: LabelsParam = "digits") -> ProfileDeleted:
    key = service.key(name, _scheme(labels), n)
    if not await service.store_call("delete", service.store.delete, key):
        raise _not_found(key)
    return ProfileDeleted(name=name, labels=key.label_scheme, n=n, deleted=True)


@router.post("/{name}/rollback", response_model=ProfileRolledBack, dependencies=[AdminAuth],
             responses=_ERRORS, summary="Make the previous kept version current again")
async def rollback_profile(
    name: NameParam, n: NParam, service: ServiceDep, labels: LabelsParam = "digits",
    version: Annotated[int | None, Query(ge=1, description="target version (default: "
                                         "the newest kept one before the current)")] = None,
) -> ProfileRolledBack:
    key = service.key(name, _scheme(labels), n)
    before = service.store.get(key)
    if before is None:
        raise _not_found(key)
    after = await service.store_call("rollback", service.store.rollback, key, version)
    return ProfileRolledBack(name=name, labels=key.label_scheme, n=n, version=after.version,
                             previous_version=before.version)
