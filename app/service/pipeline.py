"""The one request pipeline between HTTP and the engine, for every feature: the stages
(``STAGES``, defined here once), the per-request ``Context``, ``stage`` (the one context
manager that times a stage) and ``Pipeline.finish`` (the request's timings, counted).

A feature's handler calls its stages in order as plain code, each inside
``with stage(ctx, DECODE):`` and so on: retrieval is decode -> plan -> run -> debias ->
encode; calibrate and refresh estimate B and P in ``estimate`` instead of debiasing. A
stage's time goes into ``timings_ms`` and the ``stage`` label of
``lad_stage_duration_seconds`` under the keys derived from the same tuple. ``Pipeline`` also
holds what every handler shares
(the settings, the runner, the decoder, the model worker, the profiles, the method
configuration, the metrics) and the steps more than one feature takes: the labels (resolved
once per request and N), the plan (the profiles a method needs, or the one vanilla
fallback), the run through the worker's queue (its evidence is float64 from the worker on)
and the debias step (the one ``apply_method`` call of the service). Numpy arrays and engine
dataclasses never leave the service package.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from PIL import Image

from app import errors
from app.engine.interface import RetrievalItem, RunnerLike
from app.engine.labels import Labels
from app.method import debias
from app.method.calibrate import Calibration
from app.method.methods import NEEDS_CALIBRATION, MethodOutput, apply_method
from app.observability import tracing
from app.observability.metrics import Metrics
from app.service.decode import Decoder, ImageInput
from app.service.decode.decoder import is_url
from app.service.decode.media import Fetched, MediaFetcher
from app.service.profile_service import ProfileService
from app.service.worker import ModelWorker, Work, WorkResult
from app.settings import Settings
from calibration_store import Profile, ProfileKey


@dataclass(frozen=True)
class Stage:
    """One stage of a request: its name and where its time is reported."""

    name: str
    timed_as: str | None
    """The ``timings_ms`` key (the stage metric's label) its duration adds to; None when
    its parts report it."""
    parts: tuple[str, ...]
    """Finer keys measured within it (by the decoder, by the model worker)."""
    does: str
    """What it does (the docs' stage table is generated from it)."""
    answered: bool = True
    """Whether the retrieval answers' ``timings_ms`` carry its keys (False: an admin
    feature's own stage, in the stage metric only)."""
    inside: str | None = None
    """The stage that runs it (within that stage's block): its time is reported under
    its own key and taken out of that stage's."""


DECODE = Stage(
    "decode",
    "decode",
    ("base64",),
    "the checks before the queue (query, N, the labels resolved once per N, the limits), "
    "then base64 or multipart images to pixels, off the event loop (`base64` is its "
    "base64 step)",
)
FETCH = Stage(
    "fetch",
    "fetch",
    (),
    "image URLs to their bytes, when the operator allows their hosts "
    "(LAD_MEDIA_ALLOWED_DOMAINS): every URL and redirect hop checked, fetched concurrently "
    "within LAD_MEDIA_CONCURRENCY; run by decode after its checks, before the image "
    "headers are read, and taken out of decode's time",
    inside="decode",
)
PLAN = Stage(
    "plan",
    "decode",
    (),
    "the profile of every N the method needs (a read of the replica's copy, its B and P "
    "built once per version), or the operator's vanilla fallback, or 409; rerank: the "
    "window and the rounds; calibrate: the rotated instances. Timed within `decode`",
)
RUN = Stage(
    "run",
    None,
    ("queue", "process", "forward", "score"),
    "the instances through the one bounded queue (429 when full) into the worker's "
    "adaptive batches: the model's processor, one prompt forward with the attention rows "
    "of Λ captured, the label trie's scores s; the batch's times",
)
DEBIAS = Stage(
    "debias",
    "debias",
    (),
    "the method's math on (s, a) and the profile (pure numpy)",
)
ESTIMATE = Stage(
    "estimate",
    "estimate",
    (),
    "calibrate: B and P of every N from the rotated instances' evidence; refresh: the "
    "blend of offline and feedback sums and its accuracy guard (admin features only)",
    answered=False,
)
ENCODE = Stage(
    "encode",
    "encode",
    (),
    "the wire answer, and what is kept of it (the evidence for feedback, a new profile version)",
)
STAGES: tuple[Stage, ...] = (DECODE, FETCH, PLAN, RUN, DEBIAS, ESTIMATE, ENCODE)
"""The stages, in the order a feature calls those it has: the one definition of their
names."""


def _keys(stages: Sequence[Stage]) -> tuple[str, ...]:
    return tuple(
        dict.fromkeys(key for stage in stages for key in (stage.timed_as, *stage.parts) if key)
    )


RETRIEVAL_STAGES: tuple[Stage, ...] = tuple(stage for stage in STAGES if stage.answered)
"""The stages of a retrieval (retrieve, rerank), in order: its trace's stage spans."""
TIMINGS: tuple[str, ...] = _keys(RETRIEVAL_STAGES)
"""The keys of a retrieval answer's ``timings_ms`` (retrieve, rerank), in order."""
STAGE_KEYS: tuple[str, ...] = _keys(STAGES)
"""The values of the stage metric's ``stage`` label: TIMINGS and the admin stages'."""


_INSIDE: dict[str, tuple[Stage, ...]] = {
    stage.name: tuple(s for s in STAGES if s.inside == stage.name and s.timed_as)
    for stage in STAGES
}
"""The stages run (and timed) inside each stage's hook."""


def ms_since(since: float) -> float:
    return (time.perf_counter() - since) * 1e3


@dataclass
class Context:
    """One request on its way through the stages, whatever its feature; each stage's hook
    fills its fields (a feature's own fields live in a subclass)."""

    method: str = ""  # the retrieval method as requested; after plan the one that runs
    started: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)  # TIMINGS keys only
    labels: dict[int, Labels] = field(default_factory=dict)  # decode: once per N
    images: list[Image.Image] = field(default_factory=list)  # decode
    profiles: dict[int, Profile] = field(default_factory=dict)  # plan: per N
    calibrations: dict[int, Calibration] = field(default_factory=dict)  # plan: their B and P
    fallback_for: str | None = None  # plan: the method the operator's fallback replaced
    results: list[WorkResult] = field(default_factory=list)  # run
    fetched: Fetched | None = None  # fetch: the bytes fetched by URL, charged until the end

    def add(self, key: str, ms: float) -> None:
        """Add ``ms`` to a timing (a stage may take several steps: rerank's rounds)."""
        assert key in STAGE_KEYS, key
        self.timings[key] = self.timings.get(key, 0.0) + ms


@contextmanager
def stage(ctx: Context, which: Stage) -> Iterator[None]:
    """Time the block as the stage ``which`` of the request ``ctx`` (under its
    ``timed_as`` key, added: a stage may run in several steps) inside its trace span: the
    one place a stage is measured. A stage that raises is not timed (the request answers
    an error); its span records the error. A stage run inside it (fetch inside decode)
    is timed under its own key and taken out of this one's; one that had nothing to do
    reports 0 ms."""
    inner = {s.timed_as: ctx.timings.get(s.timed_as, 0.0) for s in _INSIDE[which.name]}
    start = time.perf_counter()
    with tracing.stage_span(which.name):  # a trace span per stage, same names
        yield
    if which.timed_as is not None:
        nested = sum(ctx.timings.get(key, 0.0) - ms for key, ms in inner.items() if key)
        ctx.add(which.timed_as, ms_since(start) - nested)
    for key in inner:  # a stage with nothing to do took no time (no image URL)
        if key:
            ctx.timings.setdefault(key, 0.0)


@dataclass(frozen=True)
class Plan:
    """What runs: the method (after the fallback) and the profile of every N it needs."""

    method: str
    profiles: dict[int, Profile]
    calibrations: dict[int, Calibration]
    fallback_for: str | None = None


class Handler:
    """A feature's handler over the shared pipeline: its ``__call__`` calls the feature's
    stages in order, each inside ``stage``, then ``Pipeline.finish``."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline


class Pipeline:
    """The shared parts and steps of every handler (one model, one queue, one store)."""

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
        self.media = MediaFetcher(settings, self.decoder.budget, metrics)
        self.method_config = settings.method_config()

    @property
    def model_id(self) -> str:
        return str(self.runner.model_id)

    # -------------------------------------------------------------------- after the stages
    def finish(self, ctx: Context) -> dict[str, float]:
        """The request's timings once its last stage ran, in ``STAGE_KEYS``' order, each
        counted in ``lad_stage_duration_seconds``: what a retrieval answer's
        ``timings_ms`` carries."""
        timings = {key: ctx.timings[key] for key in STAGE_KEYS if key in ctx.timings}
        self.metrics.observe_stages(timings, ctx.method)
        return timings

    @staticmethod
    def release(ctx: Context) -> None:
        """At the end of a request whatever its outcome: the bytes fetched by URL leave
        the byte budget."""
        if ctx.fetched is not None:
            ctx.fetched.release()

    # -------------------------------------------------------------------- decode
    def labels(self, n: int, value: str | Sequence[str], where: str) -> Labels:
        """N within limits and labels the model can score, within the label limits, resolved
        once (checked before the queue), with their token trie: every later stage, the
        runner included, reads these."""
        labels = self.decoder.labels(n, value, where)
        try:
            trie = self.runner.label_trie(labels.strings)  # tokenises; cached by the runner
        except ValueError as exc:
            raise errors.InvalidLabels(f"these labels cannot be scored: {exc}") from None
        self.decoder.check_label_tokens([len(seq) for seq in trie.token_sequences])
        return replace(labels, trie=trie)

    def key(self, profile: str, labels: Labels) -> ProfileKey:
        return self.profiles.key(profile, labels.scheme, labels.n)

    async def fetch(
        self,
        ctx: Context,
        groups: Sequence[tuple[str, Sequence[ImageInput]]],
        limit: tuple[str, int],
    ) -> list[list[ImageInput]]:
        """The fetch stage (run by a decode hook after its checks): each group of inputs
        (its field name, for messages) with every image URL replaced by its bytes, the
        request's fetched bytes within ``limit`` (the route's body limit: its setting and
        bytes); timed as ``fetch``. Without a URL the inputs come back as they are."""
        if not any(is_url(value) for _, inputs in groups for value in inputs):
            return [list(inputs) for _, inputs in groups]  # reported as 0 ms
        if ctx.fetched is None:
            ctx.fetched = Fetched(self.decoder.budget, limit[1], limit[0])
        with stage(ctx, FETCH):  # its span a child of decode's, which runs it
            return await self.media.fetch_all(groups, ctx.fetched)

    # -------------------------------------------------------------------- plan
    def plan(
        self,
        method: str,
        profile: str,
        labels: Sequence[Labels],
        refuse: Callable[[list[int]], errors.ServiceError],
    ) -> Plan:
        """Blocking (a store read): the current profile of every N in ``labels`` when the
        method needs one, with its B and P (built once per profile version). Missing ones
        fall back to vanilla when LAD_FALLBACK_TO_VANILLA is on (counted and logged by the
        caller as such, never hidden), else ``refuse(missing)`` is raised (409 naming what
        to calibrate)."""
        if method not in NEEDS_CALIBRATION:
            return Plan(method, {}, {})
        found = {lab.n: self.profiles.serving(self.key(profile, lab)) for lab in labels}
        missing = [n for n, p in found.items() if p is None]
        if missing and self.settings.fallback_to_vanilla:
            return Plan("vanilla", {}, {}, fallback_for=method)
        if missing:
            raise refuse(missing)
        profiles = {n: p for n, p in found.items() if p is not None}
        calibrations = {n: self.profiles.calibration(p) for n, p in profiles.items()}
        return Plan(method, profiles, calibrations)

    @staticmethod
    def adopt(ctx: Context, plan: Plan) -> None:
        """The plan's method, profiles and fallback into the context."""
        ctx.method, ctx.fallback_for = plan.method, plan.fallback_for
        ctx.profiles, ctx.calibrations = plan.profiles, plan.calibrations

    # -------------------------------------------------------------------- run
    @staticmethod
    def works(
        query: str, images: Sequence[Image.Image], labels: Labels, rotations: int
    ) -> list[Work]:
        """The first ``rotations`` cyclic orders of the images (1 = as given), one instance
        each, in rotation order, with their resolved labels."""
        return [
            Work(RetrievalItem(query, [images[p] for p in order], labels))
            for order in debias.rotations(len(images))[:rotations]
        ]

    async def forward(self, ctx: Context, works: Sequence[Work], *, bulk: bool) -> list[WorkResult]:
        """The works through the worker's queue; the run stage's parts (queue, process,
        forward, score) added to the context's timings."""
        submitted = time.perf_counter()
        results = await self.worker.run(works, bulk=bulk)
        if results:
            batches = {r.batch_id: r for r in results}.values()
            ctx.add("queue", max(0.0, (min(r.started for r in results) - submitted) * 1e3))
            ctx.add("process", sum(r.process_ms for r in batches))
            ctx.add("forward", sum(r.forward_ms for r in batches))
            ctx.add("score", sum(r.score_ms for r in batches))
        return results

    # -------------------------------------------------------------------- debias
    def debias(
        self, method: str, results: Sequence[WorkResult], calibration: Calibration | None
    ) -> MethodOutput:
        """The method applied to one instance's evidence (``results``: its rotations, the
        identity first; perm_avg reads all of them)."""
        return apply_method(
            method,
            results[0].scores,
            results[0].attention,
            calibration,
            self.method_config,
            rotated_scores=[r.scores for r in results],
        )
