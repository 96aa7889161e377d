"""The profile routes behind HTTP: list, detail, delete and roll back the running model's
profiles. A profile's offline versions (``ProfileService``) and its online statistics
(``OnlineService``) are one thing to the client: the detail shows both, a delete removes
both. Store operations, not requests of the model: they take no stages."""

from __future__ import annotations

from app.service.online import OnlineService
from lad_client.types import ProfileDeleted, ProfileList, ProfileRolledBack, ProfileSummary


class Profiles:
    """The profile routes' handler."""

    def __init__(self, online: OnlineService) -> None:
        self.online = online
        self.profiles = online.profiles

    async def list(self) -> ProfileList:
        return await self.profiles.list()

    async def detail(self, name: str) -> ProfileSummary:
        """Every (labels, N) of one profile with its kept versions and its online block."""
        return await self.online.annotate(await self.profiles.detail(name))

    async def delete(self, name: str, labels: str, n: int) -> ProfileDeleted:
        """Every version of (name, labels, N), and its feedback statistics with it."""
        deleted = await self.profiles.delete(name, labels, n)
        await self.online.forget(name, labels, n)
        return deleted

    async def rollback(
        self, name: str, labels: str, n: int, version: int | None
    ) -> ProfileRolledBack:
        return await self.profiles.rollback(name, labels, n, version)
