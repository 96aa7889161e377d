"""POST /v1/retrieve behind the route: which of N images matches the query.

decode (query, labels once, images) -> plan (the profile, or the operator's fallback) ->
run (1 or N rotations through the queue) -> debias -> encode (the wire answer, the
evidence kept for feedback, the stage metrics).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from starlette.concurrency import run_in_threadpool

from app import errors, logs
from app.engine import debias
from app.engine.methods import passes
from app.service.decode import ImageInput
from app.service.feedback import OnlineService
from app.service.pipeline import Context, Pipeline, ms_since
from lad_client.types import ProfileRef, RetrieveDetails, RetrieveOptions, RetrieveResponse


def _uncalibrated(p: Pipeline, ctx: Context) -> errors.ServiceError:
    assert ctx.labels is not None
    profile, n = ctx.profile, ctx.n
    return errors.CalibrationRequired(
        f"no calibration for model {p.model_id!r}, profile {profile!r}, labels "
        f"{ctx.labels.scheme!r} and N={n}: POST /v1/calibrate with "
        f'{{"profile": "{profile}", "examples": [...]}} holding 1-64 (5 recommended) '
        f'examples of {n} images each with their answer, or use method "vanilla" or '
        '"perm_avg"'
    )


def decode(
    p: Pipeline, options: RetrieveOptions, query: str, images: Sequence[ImageInput]
) -> Context:
    """The checks that need no thread: the query, N and the labels (resolved here, once)."""
    p.decoder.query(query)
    ctx = Context(query, images, options.method, options.profile, options.return_details)
    ctx.labels = p.labels(ctx.n, options.labels, "images")
    return ctx


def plan_and_decode_images(p: Pipeline, ctx: Context) -> None:
    """Off the event loop: the profile the method needs (looked up first, so a request that
    will be refused decodes nothing), then the decoded images."""
    assert ctx.labels is not None
    plan = p.plan(ctx.method, ctx.profile, [ctx.labels], lambda _: _uncalibrated(p, ctx))
    ctx.method, ctx.fallback_for = plan.method, plan.fallback_for
    ctx.stored = plan.profiles.get(ctx.n)
    ctx.pil = p.decoder.images(ctx.images, "images", ctx.timings)


async def run(p: Pipeline, ctx: Context) -> None:
    """The queue, forward and score stages; their times go into the context's timings."""
    assert ctx.labels is not None
    submitted = time.perf_counter()
    works = p.works(ctx.query, ctx.pil, ctx.labels, passes(ctx.method, ctx.n))
    ctx.results = results = await p.worker.run(works, bulk=False)
    batches = {r.batch_id: r for r in results}.values()
    t = ctx.timings
    t["queue"] = max(0.0, (min(r.started for r in results) - submitted) * 1e3)
    t["process"] = sum(r.process_ms for r in batches)
    t["forward"] = sum(r.forward_ms for r in batches)
    t["score"] = sum(r.score_ms for r in batches)


def encode(p: Pipeline, ctx: Context) -> RetrieveResponse:
    """The wire answer (arrays become lists here, once)."""
    assert ctx.labels is not None and ctx.out is not None
    out, stored, first = ctx.out, ctx.stored, ctx.results[0]
    s, a = first.scores, first.attention
    index = int(np.argmax(out.probabilities))
    debiased = ctx.method != "vanilla"
    p.metrics.observe_answer(
        method=ctx.method,
        n=ctx.n,
        raw=int(np.argmax(s)),
        debiased=index if debiased else None,
        profile=(stored.name, stored.label_scheme) if stored else None,
        fallback_for=ctx.fallback_for,
        prompt_tokens=first.prompt_tokens,
    )
    details = None
    if ctx.return_details:
        details = RetrieveDetails(
            labels=list(ctx.labels.strings),
            scores=s.tolist(),
            debiased_scores=None if out.debiased_scores is None else out.debiased_scores.tolist(),
            attention=a.tolist(),
            layers=list(p.runner.layers),
            batch_size=first.batch_size,
        )
    return RetrieveResponse(
        index=index,
        ranking=debias.ranking(out.probabilities),
        label=ctx.labels.strings[index],
        probabilities=out.probabilities.tolist(),
        raw_probabilities=debias.softmax(s).tolist(),
        posterior=None if out.posterior is None else out.posterior.tolist(),
        method=ctx.method,
        debiased=debiased,
        profile=ProfileRef(name=stored.name, version=stored.version) if stored else None,
        model=p.model_id,
        timings_ms=ctx.timings,
        details=details,
        request_id=errors.REQUEST_ID.get(),
    )


def _observe(p: Pipeline, ctx: Context) -> None:
    """Stage latencies, and the overhead ratio on this request's share of its batches."""
    p.metrics.observe_stages(ctx.timings, ctx.method)
    forward = sum(r.forward_ms / r.batch_size for r in ctx.results)
    score = sum(r.score_ms / r.batch_size for r in ctx.results)
    if forward > 0:
        p.metrics.debias_overhead.labels(method=ctx.method).observe(
            (score + ctx.timings["debias"]) / forward
        )


async def retrieve(
    p: Pipeline,
    online: OnlineService,
    options: RetrieveOptions,
    query: str,
    images: Sequence[ImageInput],
) -> RetrieveResponse:
    """The whole pipeline for one retrieval."""
    logs.note(
        method=options.method,
        requested_method=options.method,
        n=len(images),
        profile=options.profile,
        labels=options.labels if isinstance(options.labels, str) else "custom",
    )
    ctx = decode(p, options, query, images)
    assert ctx.labels is not None
    async with p.decoder.slot():
        await run_in_threadpool(plan_and_decode_images, p, ctx)
    if ctx.fallback_for is not None:  # the operator's fallback (LAD_FALLBACK_TO_VANILLA)
        logs.note(method=ctx.method, fallback=True)
    elif ctx.stored is not None:
        logs.note(version=ctx.stored.version, labels=ctx.stored.label_scheme)
    ctx.timings["decode"] = ms_since(ctx.started)  # base64 (its own key) and images included

    await run(p, ctx)
    t1 = time.perf_counter()
    ctx.out = p.debias(ctx.method, ctx.results, ctx.stored)
    ctx.timings["debias"] = ms_since(t1)

    t2 = time.perf_counter()
    response = encode(p, ctx)
    first = ctx.results[0]
    key = ctx.stored.key if ctx.stored else p.key(ctx.profile, ctx.labels)
    await online.remember(
        response.request_id,
        key,
        ctx.stored.version if ctx.stored else None,
        first.scores,
        first.attention,
    )
    ctx.timings["encode"] = response.timings_ms["encode"] = ms_since(t2)
    _observe(p, ctx)
    return response
