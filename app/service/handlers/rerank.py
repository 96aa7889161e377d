"""POST /v1/rerank behind the route: many candidates through the windowed tournament of
``app.engine.tournament`` (design §2.10), every window of a round in one batch of forward
passes, each window debiased with the profile of its own N.

The same stages as retrieval, per window: decode (counts, top_n, the labels of every window
size, resolved once each) -> plan (the profile of every window size, or the fallback) ->
run (one round's windows in one batch) -> debias (each window) -> encode. Everything that
can refuse the request is checked before any image is decoded or any forward runs.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Sequence

from starlette.concurrency import run_in_threadpool

from app import errors, logs
from app.engine.labels import Labels
from app.engine.methods import NEEDS_CALIBRATION, passes
from app.engine.tournament import Tournament, window_sizes
from app.service.decode import ImageInput
from app.service.pipeline import Pipeline, Plan, ms_since
from lad_client.types import (
    RerankMeta,
    RerankOptions,
    RerankResponse,
    RerankResult,
    RerankUsage,
    SentDocument,
)


class _PromptTokens:
    """The prompt tokens of every forward pass, summed (None once a pass reports none)."""

    def __init__(self) -> None:
        self.total: int | None = 0

    def add(self, counts: Iterable[int | None]) -> None:
        for count in counts:
            self.total = None if self.total is None or count is None else self.total + count


def _check_model(p: Pipeline, model: str | None) -> None:
    """`model` may name the served model only (as vLLM answers another id)."""
    if model is not None and model != p.model_id:
        raise errors.ModelNotFound(
            f"model {model[:200]!r} is not served here; this service serves {p.model_id!r} "
            "(GET /v1/models)"
        )


def _check_counts(p: Pipeline, n: int, top_n: int | None) -> int:
    limit = p.settings.max_rerank_candidates
    if n < 2:
        raise errors.TooFewImages(f"documents has {n} image(s); reranking needs >= 2")
    if n > limit:
        raise errors.TooManyImages(
            f"documents has {n} images; the limit is LAD_MAX_RERANK_CANDIDATES={limit}"
        )
    if top_n is not None and top_n > n:
        raise errors.InvalidRequest(f"top_n is {top_n} but there are only {n} documents")
    return top_n or 1


def _calibrated_sizes(p: Pipeline, profile: str, scheme: str) -> list[int]:
    """The N the profile has a current version for (the running model, these labels)."""
    return sorted(
        k.n
        for k in p.profiles.store.list_keys(p.model_id)
        if k.name == profile and k.label_scheme == scheme
    )


def _default_window(p: Pipeline, options: RerankOptions) -> int:
    """A method that reads no profile (vanilla, attn_raw, perm_avg) uses windows of
    LAD_MAX_IMAGES whatever is calibrated; one that does, the largest N the profile has
    (LAD_MAX_IMAGES when it has none: the request is then refused or falls back)."""
    if options.method not in NEEDS_CALIBRATION:
        return p.settings.max_images
    calibrated = [
        k
        for k in _calibrated_sizes(p, options.profile, options.labels)
        if k <= p.settings.max_images
    ]
    return calibrated[-1] if calibrated else p.settings.max_images


def _plan(
    p: Pipeline, options: RerankOptions, n: int, top_n: int
) -> tuple[Plan, int, list[list[int]], dict[int, Labels]]:
    """Off the event loop: the window size (default: ``_default_window``), the rounds'
    window sizes, the labels of each size (resolved once) and the plan (the profiles of
    every size, or 409)."""
    window = options.window or _default_window(p, options)
    rounds = window_sizes(n, min(window, n), top_n)
    needed = sorted({s for r in rounds for s in r})
    planned = sum(passes(options.method, s) for r in rounds for s in r)
    if planned > p.settings.max_rerank_passes:
        raise errors.InvalidRequest(
            f"this tournament ({n} documents, window {window}, top_n {top_n}, method "
            f"{options.method}) would take {planned} forward passes; the limit is "
            f"LAD_MAX_RERANK_PASSES={p.settings.max_rerank_passes}: lower top_n, use a "
            "larger window or another method"
        )
    labels = [p.labels(size, options.labels, "window") for size in needed]

    def refuse(missing: list[int]) -> errors.ServiceError:
        return errors.CalibrationRequired(
            f"the tournament of {n} documents with window {window} uses windows of N = "
            f"{needed}; profile {options.profile!r} (labels {options.labels}) has no "
            f'calibration for N = {missing}: POST /v1/calibrate with "n": "all" and examples '
            f'of at least {max(needed)} images, or rerank with method "vanilla" or "perm_avg"'
        )

    plan = p.plan(options.method, options.profile, labels, refuse)
    return plan, window, rounds, {lab.n: lab for lab in labels}


async def rerank(
    p: Pipeline,
    options: RerankOptions,
    query: str,
    documents: Sequence[ImageInput],
    sent: Sequence[SentDocument] | None = None,
) -> RerankResponse:
    """``sent``: the documents as the client sent them, echoed per result when given
    (return_documents)."""
    t0 = time.perf_counter()
    _check_model(p, options.model)
    n = len(documents)
    logs.note(method=options.method, n=n, profile=options.profile, labels=options.labels)
    top_n = _check_counts(p, n, options.top_n)  # how many advance from each window
    p.decoder.query(query)
    async with p.decoder.slot():
        plan, window, rounds, labels = await run_in_threadpool(_plan, p, options, n, top_n)
        pil = await run_in_threadpool(p.decoder.images, documents, "documents")
    if plan.fallback_for is not None:  # the operator's fallback (LAD_FALLBACK_TO_VANILLA)
        logs.note(method=plan.method, fallback=True)
    decode_ms = ms_since(t0)
    method, profiles = plan.method, plan.profiles
    seed = options.seed if options.seed is not None else secrets.randbits(32)
    tournament = Tournament(n, min(window, n), top_n, seed)
    spent, tokens = 0, _PromptTokens()
    while (windows := tournament.next_round()) is not None:
        works = [
            work
            for w in windows
            for work in p.works(query, [pil[i] for i in w], labels[len(w)], passes(method, len(w)))
        ]
        results = await p.worker.run(works, bulk=len(works) > p.settings.max_queue)
        spent += len(works)
        tokens.add(r.prompt_tokens for r in results)
        probabilities, at = [], 0
        for w in windows:
            k = passes(method, len(w))
            mine, at = results[at : at + k], at + k
            probabilities.append(p.debias(method, mine, profiles.get(len(w))).probabilities)
        tournament.record(probabilities)
    scores = tournament.relevance()
    results_out = [
        RerankResult(
            index=i, relevance_score=float(scores[i]), document=None if sent is None else sent[i]
        )
        for i in tournament.ranking()[: options.top_n or n]
    ]
    meta = RerankMeta(
        method=method,
        model=p.model_id,
        profile={str(size): prof.version for size, prof in sorted(profiles.items())} or None,
        window=min(window, n),
        seed=seed,
        rounds=tournament.rounds_played,
        windows=rounds,
        forward_passes=spent,
        timings_ms={
            "decode": decode_ms,
            "forward": ms_since(t0) - decode_ms,
            "total": ms_since(t0),
        },
    )
    request_id = errors.REQUEST_ID.get() or secrets.token_hex(16)
    return RerankResponse(
        id=f"rerank-{request_id}",
        model=p.model_id,
        usage=RerankUsage(images=n, prompt_tokens=tokens.total, forward_passes=spent),
        results=results_out,
        meta=meta,
    )
