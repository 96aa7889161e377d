"""POST /v1/calibrate behind the route: one profile version per requested N from M examples
with known answers (design §2.3, §2.9).

Calibration for one N is calibration for several N with one size: the examples' common N
is the one size, and cutting an example of N candidates to N keeps it as it is (so its
instances are the §2.3 rotations). The stages of every request: decode (the store takes
writes, the checks, the labels of every N resolved once, the images) -> plan (every N's
rotated instances) -> run (all of them in one bulk run through the queue, batches mixing
N, in waves that leave room for retrieval) -> debias (here: the estimate of B and P per N)
-> encode (every N's new version in one ``put_many``: all current or none; the answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from starlette.concurrency import run_in_threadpool

from app import errors
from app.engine.labels import Labels
from app.method.calibrate import (
    CalibrationStats,
    estimate_from_stats,
    multi_n_instances,
    raw_position_share,
)
from app.method.calibration_diagnostics import calibration_diagnostics
from app.method.methods import MethodConfig
from app.observability import logs
from app.service.pipeline import (
    DECODE,
    ENCODE,
    ESTIMATE,
    PLAN,
    RUN,
    Context,
    Handler,
    Pipeline,
    ms_since,
    stage,
)
from calibration_store import Fingerprint, Profile
from lad_client.types import CalibratedN, CalibrateRequest, CalibrateResponse


def requested_sizes(n: Sequence[int] | Literal["all"], candidates: int) -> list[int]:
    """The N to calibrate, ascending: "all" is 2..C (C = the smallest example's count)."""
    if n == "all":
        return list(range(2, candidates + 1))
    sizes = sorted(set(n))
    if sizes[-1] > candidates:
        raise errors.InvalidCalibration(
            f"n asks for N={sizes[-1]} but an example has only {candidates} images; every "
            "example needs at least max(n) candidates"
        )
    return sizes


def calibration_record(
    stats: CalibrationStats, scores: Any, attention: Any, gt: Any, config: MethodConfig
) -> dict[str, Any]:
    """What a calibration stores for online use: its offline sums ``stats`` (refresh blends
    feedback into them), its provenance and its diagnostics (from the same evidence, no
    extra pass)."""
    n = stats.n
    return {
        "calibration_statistics": stats.to_dict(),
        "provenance": {"source": "offline", "offline_examples": len(gt) // n},
        "diagnostics": calibration_diagnostics(scores, attention, gt, n, config),
    }


def recorded_hyperparameters(pipeline: Pipeline) -> dict[str, Any]:
    """The hyper-parameters a profile records: the served ``MethodConfig`` (but its
    ``use_prior`` ablation, always on in the service) and the prompt wording."""
    config = asdict(pipeline.method_config)
    del config["use_prior"]
    return {**config, "prompt_variant": pipeline.settings.prompt_variant}


def build_profile(
    pipeline: Pipeline,
    name: str,
    fingerprint: Fingerprint,
    scores: np.ndarray,
    attention: np.ndarray,
    gt: np.ndarray,
    num_examples: int,
    extra: dict[str, Any],
) -> Profile:
    """The profile of one N from its rotated instances' evidence: B and P, the raw position
    share, and what online calibration keeps (offline sums, provenance, diagnostics)."""
    stats = CalibrationStats.from_evidence(scores, attention, gt)
    calibration = estimate_from_stats(stats)
    layers = list(pipeline.runner.layers)
    hyper = {**recorded_hyperparameters(pipeline), "num_examples": num_examples, **extra}
    return Profile.create(
        name=name,
        fingerprint=fingerprint,
        layers=layers,
        bias_matrix=calibration.bias_matrix,
        attention_prior=calibration.attention_prior,
        num_examples=num_examples,
        num_forward_passes=len(scores),
        hyperparameters=hyper,
        calibration_position_share=raw_position_share(scores),
        sink_layers=[layers[i] for i in calibration.sink_layers],
        **calibration_record(stats, scores, attention, gt, pipeline.method_config),
    )


@dataclass
class CalibrateContext(Context):
    """One calibration: the request, its N, and every N's instances and new profile."""

    request: CalibrateRequest | None = None
    fingerprints: dict[int, Fingerprint] = field(default_factory=dict)  # decode
    decoded: list[list[Any]] = field(default_factory=list)  # decode: per example
    instances: dict[int, tuple[list[Any], np.ndarray]] = field(default_factory=dict)  # plan
    built: list[Profile] = field(default_factory=list)  # estimate: one per N

    @property
    def several(self) -> bool:
        """Several N from the same examples (design §2.9)."""
        return self._request().n is not None

    def _request(self) -> CalibrateRequest:
        assert self.request is not None
        return self.request


class Calibrate(Handler):
    """The calibrate feature: decode, plan (the rotations), run, estimate (B and P),
    encode (the new versions); counted by outcome (``invalid`` for the client's errors)."""

    async def __call__(self, request: CalibrateRequest) -> CalibrateResponse:
        metrics = self.pipeline.metrics
        try:
            response = await self._stages(CalibrateContext(request=request))
        except errors.ServiceError as exc:
            client_error = type(exc).status < 500 and not isinstance(exc, errors.Overloaded)
            metrics.calibrations.labels(outcome="invalid" if client_error else "error").inc()
            raise
        except Exception:
            metrics.calibrations.labels(outcome="error").inc()
            raise
        metrics.calibrations.labels(outcome="success").inc()
        metrics.calibration_duration.observe(response.duration_s)
        return response

    async def _stages(self, ctx: CalibrateContext) -> CalibrateResponse:
        try:
            with stage(ctx, DECODE):
                await self.decode(ctx)
            with stage(ctx, PLAN):
                self.plan(ctx)
            with stage(ctx, RUN):
                await self.run(ctx)
            with stage(ctx, ESTIMATE):
                self.estimate(ctx)
            with stage(ctx, ENCODE):
                response = await self.encode(ctx)
        finally:  # the bytes fetched by URL leave the budget with the request
            self.pipeline.release(ctx)
        self.pipeline.finish(ctx)
        return response

    # -------------------------------------------------------------------- decode
    def _common_n(self, request: CalibrateRequest) -> dict[int, Labels]:
        """Without ``n``: the examples' common N (422 otherwise), after the retrieval checks."""
        pipeline = self.pipeline
        sizes = {len(ex.images) for ex in request.examples}
        if len(sizes) != 1:
            raise errors.InvalidCalibration(
                f"all examples must have the same number of images N; got N in {sorted(sizes)}"
            )
        n = sizes.pop()
        labels = pipeline.labels(n, request.labels, "examples[*].images")
        for m, ex in enumerate(request.examples):
            pipeline.decoder.query(ex.query, where=f"examples[{m}].query")
            if ex.answer >= n:
                raise errors.InvalidCalibration(
                    f"examples[{m}].answer is {ex.answer}; it must be a 0-based index < N={n}"
                )
        return {n: labels}

    def _requested_n(self, request: CalibrateRequest) -> dict[int, Labels]:
        """With ``n``: every requested N after the same checks (each example, each N); the
        labels of each size are resolved once, whichever examples or N share it."""
        assert request.n is not None
        pipeline = self.pipeline
        candidates = min(len(ex.images) for ex in request.examples)
        sizes = requested_sizes(request.n, candidates)
        resolved: dict[int, Labels] = {}
        for m, ex in enumerate(request.examples):
            pipeline.decoder.query(ex.query, where=f"examples[{m}].query")
            size = len(ex.images)
            if ex.answer >= size:
                raise errors.InvalidCalibration(
                    f"examples[{m}].answer is {ex.answer}; it must be a 0-based index < "
                    f"{size}, the example's number of images"
                )
            if size not in resolved:
                resolved[size] = pipeline.labels(size, request.labels, f"examples[{m}].images")
        return {
            n: resolved[n] if n in resolved else pipeline.labels(n, request.labels, "n")
            for n in sizes
        }

    async def decode(self, ctx: CalibrateContext) -> None:
        """The store takes writes (before seconds of forward passes, not after), the checks
        and the labels of every N, then the examples' images off the event loop."""
        request, pipeline = ctx._request(), self.pipeline
        logs.note(profile=request.profile)
        await pipeline.profiles.check_writable()
        ctx.labels = self._requested_n(request) if ctx.several else self._common_n(request)
        sizes = sorted(ctx.labels)
        ctx.fingerprints = {n: pipeline.profiles.fingerprint(ctx.labels[n], n) for n in sizes}
        logs.note(n=sizes[-1], labels=ctx.fingerprints[sizes[-1]].label_scheme)
        decoder = pipeline.decoder
        body_limit = ("LAD_MAX_CALIBRATE_BODY_BYTES", pipeline.settings.max_calibrate_body_bytes)
        images = await pipeline.fetch(
            ctx,
            [(f"examples[{m}].images", ex.images) for m, ex in enumerate(request.examples)],
            body_limit,
        )
        async with decoder.slot():
            ctx.decoded = await run_in_threadpool(
                lambda: [
                    decoder.images(inputs, f"examples[{m}].images", ctx.timings)
                    for m, inputs in enumerate(images)
                ]
            )

    # -------------------------------------------------------------------- plan, run
    def plan(self, ctx: CalibrateContext) -> None:
        """Every N's rotated instances (an example cut to its GT and N - 1 negatives)."""
        request = ctx._request()
        decoded = zip(request.examples, ctx.decoded, strict=True)
        examples = [(ex.query, pil, ex.answer) for ex, pil in decoded]
        ctx.instances = multi_n_instances(examples, sorted(ctx.labels), request.seed)

    async def run(self, ctx: CalibrateContext) -> None:
        works = [
            w
            for n in sorted(ctx.labels)
            for q, images in ctx.instances[n][0]
            for w in self.pipeline.works(q, images, ctx.labels[n], 1)
        ]
        ctx.results = await self.pipeline.forward(ctx, works, bulk=True)

    # -------------------------------------------------------------------- estimate
    def estimate(self, ctx: CalibrateContext) -> None:
        """B and P of every N from its instances' evidence."""
        request, results = ctx._request(), iter(ctx.results)
        extra = {
            "negatives_seed": request.seed,
            "candidates": min(len(images) for images in ctx.decoded),
        }
        for n in sorted(ctx.labels):
            instances, gt = ctx.instances[n]
            batch = [next(results) for _ in instances]
            ctx.built.append(
                build_profile(
                    self.pipeline,
                    request.profile,
                    ctx.fingerprints[n],
                    np.stack([r.scores for r in batch]),
                    np.stack([r.attention for r in batch]),
                    gt,
                    len(request.examples),
                    extra if ctx.several else {},
                )
            )

    # -------------------------------------------------------------------- encode
    async def encode(self, ctx: CalibrateContext) -> CalibrateResponse:
        """Every N's new version, all current or none, and the answer."""
        stored = await self.pipeline.profiles.put_many(ctx.built)
        logs.note(version=stored[-1].version)
        per_n = (
            [
                CalibratedN(
                    n=s.n,
                    version=s.version,
                    forward_passes=s.num_forward_passes,
                    bias_matrix=s.bias_matrix,
                    attention_prior=s.attention_prior,
                    sink_layers=s.sink_layers,
                )
                for s in stored
            ]
            if ctx.several
            else None
        )
        last = stored[-1]
        return CalibrateResponse(
            profile=last.name,
            version=last.version,
            model=self.pipeline.model_id,
            labels=last.label_scheme,
            n=last.n,
            num_examples=last.num_examples,
            forward_passes=len(ctx.results),
            bias_matrix=last.bias_matrix,
            attention_prior=last.attention_prior,
            layers=last.layers,
            sink_layers=last.sink_layers,
            hyperparameters=last.hyperparameters,
            created_at=last.created_at,
            duration_s=round(ms_since(ctx.started) / 1e3, 4),
            diagnostics=last.diagnostics,
            per_n=per_n,
        )
