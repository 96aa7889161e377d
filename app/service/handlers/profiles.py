"""The profile routes behind HTTP: list, detail, delete and roll back the running model's
profiles. A profile's offline versions (``ProfileService``) and its online statistics
(``OnlineService``) are one thing to the client: the detail shows both, a delete removes
both."""

from __future__ import annotations

from app.service.feedback import OnlineService
from lad_client.types import ProfileDeleted, ProfileList, ProfileRolledBack, ProfileSummary


async def list_profiles(online: OnlineService) -> ProfileList:
    return await online.profiles.list()


async def detail(online: OnlineService, name: str) -> ProfileSummary:
    """Every (labels, N) of one profile with its kept versions and its online block."""
    return await online.annotate(await online.profiles.detail(name))


async def delete(online: OnlineService, name: str, labels: str, n: int) -> ProfileDeleted:
    """Every version of (name, labels, N), and its feedback statistics with it."""
    deleted = await online.profiles.delete(name, labels, n)
    await online.forget(name, labels, n)
    return deleted


async def rollback(
    online: OnlineService, name: str, labels: str, n: int, version: int | None
) -> ProfileRolledBack:
    return await online.profiles.rollback(name, labels, n, version)
