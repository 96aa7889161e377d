"""Profile operations of the running model: lookup with the engine check, list, detail,
delete, rollback and put, every store call off the event loop.

The handlers read and write profiles through ``ProfileService`` only; store errors become
the service's errors here, in ``call`` (the online store's calls go through it too). A
served profile's B and P are built once per version (``calibration``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from app import errors
from app.engine.interface import RunnerLike
from app.engine.labels import Labels, LabelSpec, stored_scheme
from app.method.calibrate import Calibration
from app.observability import logs
from app.observability.metrics import Metrics, ProfileRow
from app.service.decode import parse_label_text
from calibration_store import Fingerprint, Profile, ProfileKey, ProfileStore, StoreError
from calibration_store import StoreUnavailable as StoreDown
from lad_client.types import (
    ProfileDeleted,
    ProfileEntry,
    ProfileList,
    ProfileRolledBack,
    ProfileSummary,
    ProfileVersion,
)

V = TypeVar("V")
FINGERPRINT_CACHE_SIZE = 512
SERVED_CACHE_SIZE = 4096
"""Profile keys whose checked version and arrays are kept (one entry per key served)."""


def calibration_of(profile: Profile) -> Calibration:
    """The engine's view of a stored profile: B and P as arrays (``ProfileService.
    calibration`` keeps it per version)."""
    return Calibration(profile.bias_matrix_array(), profile.attention_prior_array())


def legacy_profiles_note(store: ProfileStore, served: str, source: str) -> str | None:
    """Profiles written before served names existed are keyed by LAD_MODEL as it was typed
    (a local path): when the store holds some under ``source`` and none under the served
    name, what to do about it (None otherwise, or when the store cannot say)."""
    if served == source:
        return None
    try:
        old = store.list_keys(source)
        if not old or store.list_keys(served):
            return None
    except StoreError:
        return None
    return (
        f"the store holds {len(old)} profile(s) keyed by {source!r} (LAD_MODEL: profiles were "
        f"keyed by it before served names) and none for the served name {served!r}: set "
        f"LAD_SERVED_MODEL_NAME={source} to serve them, or recalibrate (docs/configuration.md)"
    )


class ProfileService:
    """The profiles of one model in one store, checked against one runner."""

    def __init__(self, runner: RunnerLike, store: ProfileStore, metrics: Metrics) -> None:
        self.runner = runner
        self.store = store
        self.metrics = metrics
        self._fingerprints: dict[tuple[LabelSpec, int], Fingerprint] = {}
        self._served: dict[ProfileKey, tuple[Profile, Calibration]] = {}
        metrics.watch_profiles(self._metric_rows)

    @property
    def model_id(self) -> str:
        return str(self.runner.model_id)

    # ------------------------------------------------------------------ keys and checks
    def fingerprint(self, labels: LabelSpec | Labels, n: int) -> Fingerprint:
        """The engine fingerprint for (labels, N), cached (it hashes the chat template);
        resolved labels are not resolved again."""
        key = (labels.spec if isinstance(labels, Labels) else labels, n)
        found = self._fingerprints.get(key)
        if found is None:
            if len(self._fingerprints) >= FINGERPRINT_CACHE_SIZE:  # custom labels vary freely
                self._fingerprints.pop(next(iter(self._fingerprints)))
            found = self._fingerprints[key] = self.runner.fingerprint(labels, n)
        return found

    def key(self, name: str, scheme: str, n: int) -> ProfileKey:
        return ProfileKey(model_id=self.model_id, name=name, label_scheme=scheme, n=n)

    def mismatches(self, profile: Profile) -> dict[str, tuple[Any, Any]]:
        """How the profile's engine differs from the running one (labels do not count)."""
        engine = self.fingerprint("digits", profile.n).model_copy(
            update={"label_scheme": profile.label_scheme}
        )
        diff = profile.fingerprint.mismatches(engine)
        if list(profile.layers) != list(self.runner.layers):
            diff["layers"] = (list(profile.layers), list(self.runner.layers))
        return diff

    def compatible(self, profile: Profile) -> bool:
        """Whether the running engine would serve this profile."""
        return not self.mismatches(profile)

    def current(self, name: str, labels: LabelSpec, n: int) -> Profile | None:
        """The profile serving (name, labels, N), None if uncalibrated; raises ProfileMismatch
        when it was calibrated under another engine. Reads the in-memory copy: call it off
        the event loop like every store call."""
        return self.serving(self.key(name, self.fingerprint(labels, n).label_scheme, n))

    def serving(self, key: ProfileKey) -> Profile | None:
        """The profile serving ``key`` (see :meth:`current`; blocking, off the event loop).
        A version is checked against the engine once: the store hands out the same object
        until a new version replaces it."""
        profile = self.store.get(key)
        if profile is None:
            return None
        served = self._served.get(key)
        if served is not None and served[0] is profile:
            return profile
        self._check(key, profile)
        if len(self._served) >= SERVED_CACHE_SIZE:
            self._served.pop(next(iter(self._served)))
        self._served[key] = (profile, calibration_of(profile))
        return profile

    def calibration(self, profile: Profile) -> Calibration:
        """B and P of a profile as arrays, built once per version served."""
        served = self._served.get(self.key(profile.name, profile.label_scheme, profile.n))
        if served is not None and served[0] is profile:
            return served[1]
        return calibration_of(profile)

    def peek(self, key: ProfileKey) -> Profile | None:
        """The replica's copy of ``key``'s current profile (no store round trip; it may be
        called on the event loop)."""
        return self.store.get(key)

    async def get(self, key: ProfileKey) -> Profile | None:
        """The current profile of ``key``, off the event loop."""
        return await self.call("get", self.store.get, key)

    def sizes(self, name: str, scheme: str) -> list[int]:
        """The N that profile ``name`` has a current version for under these labels
        (blocking: off the event loop)."""
        return sorted(
            k.n
            for k in self.store.list_keys(self.model_id)
            if k.name == name and k.label_scheme == scheme
        )

    def _check(self, key: ProfileKey, profile: Profile) -> None:
        """ProfileMismatch when ``profile`` was calibrated under another engine."""
        diff = self.mismatches(profile)
        if diff:
            what = ", ".join(f"{k}: profile {a!r} vs engine {b!r}" for k, (a, b) in diff.items())
            raise errors.ProfileMismatch(
                f"profile {key.name!r} v{profile.version} (labels {key.label_scheme}, "
                f"N={key.n}) was calibrated under a different engine ({what}); recalibrate "
                "with POST /v1/calibrate"
            )
        return profile

    # ------------------------------------------------------------------ store calls
    async def call(self, operation: str | None, fn: Callable[..., V], *args: Any) -> V:
        """A store call off the event loop, the profile store's or the online store's: the
        one translation of store errors into the service's. A profile store's outage is
        counted by ``operation`` (None: an online-store call, not counted)."""
        try:
            return await run_in_threadpool(fn, *args)
        except StoreError as exc:
            if isinstance(exc, StoreDown) and operation is not None:
                self.metrics.store_errors.labels(operation=operation).inc()
            raise errors.translate(exc) or errors.StoreUnavailable(str(exc)) from exc

    async def check_writable(self) -> None:
        """503 ``store_unavailable`` now when the store refuses writes (its latest write or
        a fresh probe failed), before an admin write computes anything: under Redis
        ``maxmemory`` a calibration computed for 9-44 s and only then learned it."""
        if await run_in_threadpool(self._writes_failing):
            self.metrics.store_errors.labels(operation="put").inc()  # the put it stands for
            raise errors.StoreUnavailable(
                "the calibration store refuses writes (read-only, full, or at its memory "
                "limit); nothing was computed: retry once it takes writes again"
            )

    def _writes_failing(self) -> bool:
        try:  # a real write to come: probe now (a recovered store is seen at once)
            return self.store.check_writes(force=True) is False
        except StoreError:
            return True

    async def put(self, profile: Profile) -> Profile:
        return await self.call("put", self.store.put, profile)

    async def put_many(self, profiles: list[Profile]) -> list[Profile]:
        """Several profiles' new versions, current all or none (design §2.9)."""
        return await self.call("put", self.store.put_many, profiles)

    def _current_profiles(self) -> dict[ProfileKey, Profile]:
        found = {}
        for key in self.store.list_keys(self.model_id):
            profile = self.store.get(key)
            if profile is not None:
                found[key] = profile
        return found

    def _metric_rows(self) -> Iterator[ProfileRow]:
        for key, profile in self._current_profiles().items():
            ts = profile.created_at.timestamp() if profile.created_at else 0.0
            share = profile.calibration_position_share
            yield key.name, key.label_scheme, key.n, profile.version, ts, share

    def _entry(self, current: Profile, kept: list[Profile] | None) -> ProfileEntry:
        versions = [
            ProfileVersion(
                version=p.version,
                created_at=p.created_at,
                num_examples=p.num_examples,
                current=p.version == current.version,
            )
            for p in kept or []
        ]
        return ProfileEntry(
            labels=current.label_scheme,
            n=current.n,
            current_version=current.version,
            created_at=current.created_at,
            num_examples=current.num_examples,
            compatible=self.compatible(current),
            versions=versions,
        )

    # ------------------------------------------------------------------ operations
    async def list(self) -> ProfileList:
        """Every current profile of the running model, grouped by name."""
        current = await self.call("list", self._current_profiles)
        by_name: dict[str, list[ProfileEntry]] = {}
        for key, profile in current.items():
            by_name.setdefault(key.name, []).append(self._entry(profile, None))
        summaries = [
            ProfileSummary(name=name, model=self.model_id, entries=entries)
            for name, entries in sorted(by_name.items())
        ]
        return ProfileList(model=self.model_id, profiles=summaries)

    def _detail_rows(self, name: str) -> list[tuple[Profile, list[Profile]]]:
        """Each current profile of ``name`` with its kept versions. The current ones are
        the replica's own copy; the kept ones are read from the store, and while it is
        unavailable only the current version is listed (a read route answers from what
        the replica holds, as retrieve does)."""
        rows = []
        for key, current in self._current_profiles().items():
            if key.name == name:
                try:
                    kept = [self.store.get_version(key, v) for v in self.store.versions(key)]
                except StoreDown:
                    self.metrics.store_errors.labels(operation="versions").inc()
                    kept = [current]
                rows.append((current, [p for p in kept if p is not None]))
        return rows

    async def detail(self, name: str) -> ProfileSummary:
        """Every (labels, N) of one profile name with its kept versions."""
        rows = await self.call("versions", self._detail_rows, name)
        if not rows:
            raise errors.ProfileNotFound(f"no profile named {name!r} for model {self.model_id!r}")
        entries = [self._entry(current, kept) for current, kept in rows]
        return ProfileSummary(name=name, model=self.model_id, entries=entries)

    def stored_key(self, name: str, labels: str, n: int) -> ProfileKey:
        """The store key of a (name, labels text, N) given on a profile route."""
        spec = parse_label_text(labels)
        try:
            return self.key(name, stored_scheme(spec), n)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError too
            raise errors.InvalidLabels(
                f"labels {labels[:80]!r} name no profile key: {str(exc).splitlines()[0][:200]}"
            ) from None

    async def delete(self, name: str, labels: str, n: int) -> ProfileDeleted:
        key = self.stored_key(name, labels, n)
        logs.note(profile=name, labels=key.label_scheme, n=n)
        current = await self.call("get", self.store.get, key)
        if current is not None:
            logs.note(version=current.version)  # the audit line says which version went
        if not await self.call("delete", self.store.delete, key):
            raise _not_found(key)
        return ProfileDeleted(name=name, labels=key.label_scheme, n=n, deleted=True)

    async def rollback(
        self, name: str, labels: str, n: int, version: int | None
    ) -> ProfileRolledBack:
        """Make the newest kept version before the current one (or ``version``) current."""
        key = self.stored_key(name, labels, n)
        logs.note(profile=name, labels=key.label_scheme, n=n)
        before = await self.call("get", self.store.get, key)
        if before is None:
            raise _not_found(key)
        logs.note(previous_version=before.version)
        after = await self.call("rollback", self.store.rollback, key, version)
        logs.note(version=after.version)
        return ProfileRolledBack(
            name=name,
            labels=key.label_scheme,
            n=n,
            version=after.version,
            previous_version=before.version,
        )


def _not_found(key: ProfileKey) -> errors.ProfileNotFound:
    return errors.ProfileNotFound(
        f"no profile {key.name!r} with labels {key.label_scheme} and N={key.n}"
    )
