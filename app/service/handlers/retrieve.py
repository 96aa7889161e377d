"""POST /v1/retrieve behind the route: which of N images matches the query.

decode (query, labels once, images) -> plan (the profile, or the operator's fallback) ->
run (1 or N rotations through the queue) -> debias -> encode (the wire answer, the
evidence kept for feedback, the answer metrics).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from starlette.concurrency import run_in_threadpool

from app import errors
from app.method import debias
from app.method.methods import MethodOutput, passes
from app.observability import logs
from app.observability.request_context import REQUEST_ID
from app.service.decode import ImageInput
from app.service.online import OnlineService
from app.service.pipeline import (
    DEBIAS,
    DECODE,
    ENCODE,
    PLAN,
    RUN,
    Context,
    Handler,
    Pipeline,
    stage,
)
from lad_client.types import ProfileRef, RetrieveDetails, RetrieveOptions, RetrieveResponse


@dataclass
class RetrieveContext(Context):
    """One retrieval: the request as parsed, and its one N's labels, profile and answer."""

    options: RetrieveOptions | None = None
    query: str = ""
    inputs: Sequence[ImageInput] = ()
    out: MethodOutput | None = None  # debias

    @property
    def n(self) -> int:
        return len(self.inputs)


class Retrieve(Handler):
    """The retrieve feature: decode, plan, run, debias, encode."""

    def __init__(self, pipeline: Pipeline, online: OnlineService) -> None:
        super().__init__(pipeline)
        self.online = online

    async def __call__(
        self, options: RetrieveOptions, query: str, images: Sequence[ImageInput]
    ) -> RetrieveResponse:
        """One retrieval, its stages in order."""
        ctx = RetrieveContext(method=options.method, options=options, query=query, inputs=images)
        try:
            with stage(ctx, DECODE):
                await self.decode(ctx)
            with stage(ctx, PLAN):
                await self.plan(ctx)
            with stage(ctx, RUN):
                await self.run(ctx)
            with stage(ctx, DEBIAS):
                self.debias(ctx)
            with stage(ctx, ENCODE):
                response = await self.encode(ctx)
        finally:  # the bytes fetched by URL leave the budget with the request
            self.pipeline.release(ctx)
        response.timings_ms.update(self.pipeline.finish(ctx))
        self.observe(ctx)
        return response

    def _options(self, ctx: RetrieveContext) -> RetrieveOptions:
        assert ctx.options is not None
        return ctx.options

    async def decode(self, ctx: RetrieveContext) -> None:
        """The checks that need no thread (the query, N, the labels: resolved here, once),
        then the images off the event loop."""
        options, pipeline = self._options(ctx), self.pipeline
        logs.note(
            method=options.method, requested_method=options.method, n=ctx.n, profile=options.profile
        )
        pipeline.decoder.query(ctx.query)
        ctx.labels[ctx.n] = pipeline.labels(ctx.n, options.labels, "images")
        # logged once valid: a refused value is named by its error, never in the log
        logs.note(labels=options.labels if isinstance(options.labels, str) else "custom")
        body_limit = ("LAD_MAX_BODY_BYTES", pipeline.settings.max_body_bytes)
        [ctx.inputs] = await pipeline.fetch(ctx, [("images", ctx.inputs)], body_limit)
        async with pipeline.decoder.slot():
            ctx.images = await run_in_threadpool(
                pipeline.decoder.images, ctx.inputs, "images", ctx.timings
            )

    def _uncalibrated(self, ctx: RetrieveContext) -> errors.ServiceError:
        profile, n, labels = self._options(ctx).profile, ctx.n, ctx.labels[ctx.n]
        return errors.CalibrationRequired(
            f"no calibration for model {self.pipeline.model_id!r}, profile {profile!r}, labels "
            f"{labels.scheme!r} and N={n}: POST /v1/calibrate with "
            f'{{"profile": "{profile}", "examples": [...]}} holding 1-64 (5 recommended) '
            f'examples of {n} images each with their answer, or use method "vanilla" or '
            '"perm_avg"'
        )

    async def plan(self, ctx: RetrieveContext) -> None:
        """The profile the method needs (a store read, off the event loop), or the fallback."""
        options = self._options(ctx)
        plan = await run_in_threadpool(
            self.pipeline.plan,
            ctx.method,
            options.profile,
            [ctx.labels[ctx.n]],
            lambda _: self._uncalibrated(ctx),
        )
        self.pipeline.adopt(ctx, plan)
        if ctx.fallback_for is not None:  # the operator's fallback (LAD_FALLBACK_TO_VANILLA)
            logs.note(method=ctx.method, fallback=True)
        elif ctx.n in ctx.profiles:
            stored = ctx.profiles[ctx.n]
            logs.note(version=stored.version, labels=stored.label_scheme)

    async def run(self, ctx: RetrieveContext) -> None:
        """1 or N rotations (perm_avg) through the queue."""
        works = self.pipeline.works(
            ctx.query, ctx.images, ctx.labels[ctx.n], passes(ctx.method, ctx.n)
        )
        ctx.results = await self.pipeline.forward(ctx, works, bulk=False)

    def debias(self, ctx: RetrieveContext) -> None:
        ctx.out = self.pipeline.debias(ctx.method, ctx.results, ctx.calibrations.get(ctx.n))

    async def encode(self, ctx: RetrieveContext) -> RetrieveResponse:
        """The wire answer (arrays become lists here, once) and the evidence kept for
        feedback."""
        assert ctx.out is not None
        pipeline, labels = self.pipeline, ctx.labels[ctx.n]
        out, stored, first = ctx.out, ctx.profiles.get(ctx.n), ctx.results[0]
        s, a = first.scores, first.attention
        index = int(np.argmax(out.probabilities))
        debiased = ctx.method != "vanilla"
        pipeline.metrics.observe_answer(
            method=ctx.method,
            n=ctx.n,
            raw=int(np.argmax(s)),
            debiased=index if debiased else None,
            profile=(stored.name, stored.label_scheme) if stored else None,
            fallback_for=ctx.fallback_for,
            prompt_tokens=first.prompt_tokens,
        )
        details = None
        if self._options(ctx).return_details:
            details = RetrieveDetails(
                labels=list(labels.strings),
                scores=s.tolist(),
                debiased_scores=None
                if out.debiased_scores is None
                else out.debiased_scores.tolist(),
                attention=a.tolist(),
                layers=list(pipeline.runner.layers),
                batch_size=first.batch_size,
            )
        response = RetrieveResponse(
            index=index,
            ranking=debias.ranking(out.probabilities),
            label=labels.strings[index],
            probabilities=out.probabilities.tolist(),
            raw_probabilities=debias.softmax(s).tolist(),
            posterior=None if out.posterior is None else out.posterior.tolist(),
            method=ctx.method,
            debiased=debiased,
            profile=ProfileRef(name=stored.name, version=stored.version) if stored else None,
            model=pipeline.model_id,
            timings_ms={},
            details=details,
            request_id=REQUEST_ID.get(),
        )
        key = pipeline.key(self._options(ctx).profile, labels)
        version = stored.version if stored else None
        await self.online.remember(response.request_id, key, version, s, a)
        return response

    def observe(self, ctx: RetrieveContext) -> None:
        """The overhead ratio on this request's share of its batches."""
        forward = sum(r.forward_ms / r.batch_size for r in ctx.results)
        score = sum(r.score_ms / r.batch_size for r in ctx.results)
        if forward > 0:
            self.pipeline.metrics.debias_overhead.labels(method=ctx.method).observe(
                (score + ctx.timings["debias"]) / forward
            )
