"""POST /v1/rerank behind the routes: many candidates through the windowed tournament of
``app.engine.tournament`` (design §2.10), every window of a round in one batch of forward
passes, each window debiased with the profile of its own N.

Everything that can refuse the request (counts, top_n, labels for every window size, the
profiles of every window size) is checked before any image is decoded or any forward runs.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Protocol

from starlette.concurrency import run_in_threadpool

from app import errors, logs
from app.decode import ImageInput
from app.engine import debias
from app.engine.interface import RetrievalItem
from app.engine.labels import label_spec
from app.engine.methods import NEEDS_CALIBRATION, apply_method, passes
from app.engine.tournament import Tournament, window_sizes
from app.service.calibration import Service as CalibratingService
from app.service.profiles import calibration_of
from app.service.worker import Work
from calibration_store import Profile
from lad_client.types import RerankMeta, RerankOptions, RerankResponse, RerankResult


class Service(CalibratingService, Protocol):
    """What a rerank needs of ``app.service.core.Service`` (what a calibration needs)."""


def _calibrated_sizes(service: Service, profile: str, scheme: str) -> list[int]:
    """The N the profile has a current version for (the running model, these labels)."""
    return sorted(
        k.n for k in service.profiles.store.list_keys(service.model_id)
        if k.name == profile and k.label_scheme == scheme
    )  # fmt: skip


def _check_counts(service: Service, n: int, top_n: int | None) -> int:
    limit = service.settings.max_rerank_candidates
    if n < 2:
        raise errors.TooFewImages(f"documents has {n} image(s); reranking needs >= 2")
    if n > limit:
        raise errors.TooManyImages(
            f"documents has {n} images; the limit is LAD_MAX_RERANK_CANDIDATES={limit}"
        )
    if top_n is not None and top_n > n:
        raise errors.InvalidRequest(f"top_n is {top_n} but there are only {n} documents")
    return top_n or 1


def _profiles(
    service: Service, options: RerankOptions, n: int, top_n: int
) -> tuple[str, int, list[list[int]], dict[int, Profile]]:
    """Off the event loop: the method (vanilla when uncalibrated and LAD_FALLBACK_TO_VANILLA
    is on), the window size, the rounds' window sizes and, for a method that needs one, the
    current profile of every window size (else 409 naming the missing N)."""
    spec = label_spec(options.labels)
    scheme = service.profiles.fingerprint(spec, 2).label_scheme
    calibrated = [k for k in _calibrated_sizes(service, options.profile, scheme)
                  if k <= service.settings.max_images]  # fmt: skip
    window = options.window or (calibrated[-1] if calibrated else service.settings.max_images)
    rounds = window_sizes(n, min(window, n), top_n)
    needed = sorted({s for r in rounds for s in r})
    planned = sum(passes(options.method, s) for r in rounds for s in r)
    if planned > service.settings.max_rerank_passes:
        raise errors.InvalidRequest(
            f"this tournament ({n} documents, window {window}, top_n {top_n}, method "
            f"{options.method}) would take {planned} forward passes; the limit is "
            f"LAD_MAX_RERANK_PASSES={service.settings.max_rerank_passes}: lower top_n, use a "
            "larger window or another method"
        )
    for size in needed:
        service.check_labels(size, spec, "window")
    if options.method not in NEEDS_CALIBRATION:
        return options.method, window, rounds, {}
    found = {size: service.profiles.current(options.profile, spec, size) for size in needed}
    missing = [size for size, p in found.items() if p is None]
    if missing and service.settings.fallback_to_vanilla:
        return "vanilla", window, rounds, {}
    if missing:
        raise errors.CalibrationRequired(
            f"the tournament of {n} documents with window {window} uses windows of N = "
            f"{needed}; profile {options.profile!r} (labels {scheme}) has no calibration for "
            f'N = {missing}: POST /v1/calibrate with "n": "all" and examples of at least '
            f'{max(needed)} images, or rerank with method "vanilla" or "perm_avg"'
        )
    return options.method, window, rounds, {s: p for s, p in found.items() if p is not None}


async def rerank(
    service: Service, query: str, documents: Sequence[ImageInput], options: RerankOptions
) -> RerankResponse:
    t0 = time.perf_counter()
    n = len(documents)
    logs.note(method=options.method, n=n, profile=options.profile, labels=options.labels)
    top_n = _check_counts(service, n, options.top_n)  # how many advance from each window
    service.decoder.query(query)
    async with service.decoder.slot():
        method, window, rounds, profiles = await run_in_threadpool(
            _profiles, service, options, n, top_n
        )
        pil = await run_in_threadpool(service.decoder.images, documents, "documents")
    if method != options.method:  # the operator's fallback (LAD_FALLBACK_TO_VANILLA), logged
        logs.note(method=method, fallback=True)
    decode_ms = (time.perf_counter() - t0) * 1e3
    seed = options.seed if options.seed is not None else secrets.randbits(32)
    tournament = Tournament(n, min(window, n), top_n, seed)
    spent = 0
    while (windows := tournament.next_round()) is not None:
        works = [
            Work(RetrievalItem(query, [pil[w[p]] for p in order]), label_spec(options.labels))
            for w in windows
            for order in debias.rotations(len(w))[: passes(method, len(w))]
        ]
        results = await service.worker.run(works, bulk=len(works) > service.settings.max_queue)
        spent += len(works)
        probabilities, at = [], 0
        for w in windows:
            k = passes(method, len(w))
            mine, at = results[at : at + k], at + k
            profile = profiles.get(len(w))
            out = apply_method(
                method, mine[0].scores, mine[0].attention,
                calibration_of(profile) if profile else None, service.method_config,
                rotated_scores=[r.scores for r in mine],
            )  # fmt: skip
            probabilities.append(out.probabilities)
        tournament.record(probabilities)
    scores = tournament.scores()
    results_out = [
        RerankResult(index=i, relevance_score=float(scores[i]))
        for i in tournament.ranking()[: options.top_n or n]
    ]
    meta = RerankMeta(
        method=method, model=service.model_id,
        profile={str(size): p.version for size, p in sorted(profiles.items())} or None,
        window=min(window, n), seed=seed, rounds=tournament.rounds_played, windows=rounds,
        forward_passes=spent,
        timings_ms={"decode": decode_ms, "forward": (time.perf_counter() - t0) * 1e3 - decode_ms,
                    "total": (time.perf_counter() - t0) * 1e3},
    )  # fmt: skip
    return RerankResponse(results=results_out, meta=meta)
