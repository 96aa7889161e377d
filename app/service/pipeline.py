"""The one request pipeline between HTTP and the engine: decode -> plan -> run -> debias ->
encode, as stages over a per-request context.

``Pipeline`` holds what every handler shares (the settings, the runner, the decoder, the
model worker, the profiles, the method configuration, the metrics) and the stages that more
than one feature runs: the labels (resolved once per request and N), the plan (the profiles
a method needs, and the one vanilla fallback), the run's instances (through the worker's
queue, whose evidence is cast to float64 once, there) and the debias step (the one
``apply_method`` call of the service). A handler in ``app.service.handlers`` strings the
stages together for its feature and encodes its own wire schema; numpy arrays and engine
dataclasses never leave the service package.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from PIL import Image

from app import errors
from app.engine import debias
from app.engine.interface import RetrievalItem, RunnerLike
from app.engine.labels import Labels
from app.engine.methods import NEEDS_CALIBRATION, MethodConfig, MethodOutput, apply_method
from app.metrics import Metrics
from app.service.decode import Decoder, ImageInput
from app.service.profiles import ProfileService, calibration_of
from app.service.worker import ModelWorker, Work, WorkResult
from app.settings import Settings
from calibration_store import Profile, ProfileKey


def ms_since(since: float) -> float:
    return (time.perf_counter() - since) * 1e3


@dataclass
class Context:
    """One retrieval on its way through the stages; each stage fills its fields."""

    query: str
    images: Sequence[ImageInput]
    method: str  # as requested; after ``plan`` the one that runs
    profile: str
    return_details: bool = False
    started: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)
    labels: Labels | None = None  # decode: resolved once
    pil: list[Image.Image] = field(default_factory=list)  # decode
    stored: Profile | None = None  # plan
    fallback_for: str | None = None  # plan: the method the operator's fallback replaced
    results: list[WorkResult] = field(default_factory=list)  # run: one per rotation
    out: MethodOutput | None = None  # debias

    @property
    def n(self) -> int:
        return len(self.images)


@dataclass(frozen=True)
class Plan:
    """What runs: the method (after the fallback) and the profile of every N it needs."""

    method: str
    profiles: dict[int, Profile]
    fallback_for: str | None = None


class Pipeline:
    """The shared parts and stages of every handler (one model, one queue, one store)."""

    def __init__(
        self, settings: Settings, runner: RunnerLike, profiles: ProfileService, metrics: Metrics
    ) -> None:
        self.settings = settings
        self.runner = runner
        self.profiles = profiles
        self.metrics = metrics
        self.worker = ModelWorker(runner, settings, metrics)
        self.decoder = Decoder(
            settings,
            pixel_budget=runner.image_pixel_budget(),
            special_tokens=runner.special_tokens(),
            image_size=getattr(runner, "image_size_for", None),
        )
        self.method_config = MethodConfig(
            top_k=settings.top_k,
            tau=settings.tau,
            posterior_variant=settings.posterior_variant,
            mixture=settings.mixture,
            sink_guard=settings.sink_guard,
        )

    @property
    def model_id(self) -> str:
        return str(self.runner.model_id)

    # -------------------------------------------------------------------- decode
    def labels(self, n: int, value: str | Sequence[str], where: str) -> Labels:
        """N within limits and labels the model can score, within the label limits, resolved
        once (checked before the queue)."""
        labels = self.decoder.labels(n, value, where)
        try:
            trie = self.runner.label_trie(labels.strings)  # tokenises; cached by the runner
        except ValueError as exc:
            raise errors.InvalidLabels(f"these labels cannot be scored: {exc}") from None
        self.decoder.check_label_tokens([len(seq) for seq in trie.token_sequences])
        return labels

    def key(self, profile: str, labels: Labels) -> ProfileKey:
        return self.profiles.key(profile, labels.scheme, labels.n)

    # -------------------------------------------------------------------- plan
    def plan(
        self,
        method: str,
        profile: str,
        labels: Sequence[Labels],
        refuse: Callable[[list[int]], errors.ServiceError],
    ) -> Plan:
        """Blocking (a store read): the current profile of every N in ``labels`` when the
        method needs one. Missing ones fall back to vanilla when LAD_FALLBACK_TO_VANILLA is
        on (counted and logged by the caller as such, never hidden), else ``refuse(missing)``
        is raised (409 naming what to calibrate)."""
        if method not in NEEDS_CALIBRATION:
            return Plan(method, {})
        found = {lab.n: self.profiles.serving(self.key(profile, lab)) for lab in labels}
        missing = [n for n, p in found.items() if p is None]
        if missing and self.settings.fallback_to_vanilla:
            return Plan("vanilla", {}, fallback_for=method)
        if missing:
            raise refuse(missing)
        return Plan(method, {n: p for n, p in found.items() if p is not None})

    # -------------------------------------------------------------------- run
    @staticmethod
    def works(
        query: str, images: Sequence[Image.Image], labels: Labels, rotations: int
    ) -> list[Work]:
        """The first ``rotations`` cyclic orders of the images (1 = as given), one instance
        each, in rotation order."""
        return [
            Work(RetrievalItem(query, [images[p] for p in order]), labels.spec)
            for order in debias.rotations(len(images))[:rotations]
        ]

    # -------------------------------------------------------------------- debias
    def debias(
        self, method: str, results: Sequence[WorkResult], profile: Profile | None
    ) -> MethodOutput:
        """The method applied to one instance's evidence (``results``: its rotations, the
        identity first; perm_avg reads all of them)."""
        return apply_method(
            method,
            results[0].scores,
            results[0].attention,
            calibration_of(profile) if profile else None,
            self.method_config,
            rotated_scores=[r.scores for r in results],
        )
