"""POST /v1/calibrate behind the route: one profile version per requested N from M examples
with known answers (design §2.3, §2.9).

Calibration for one N is calibration for several N with one size: the examples' common N
is the one size, and cutting an example of N candidates to N keeps it as it is (so its
instances are the §2.3 rotations). decode (the checks, the labels of every N resolved once,
the images) -> plan (every N's rotated instances) -> run (all of them in one bulk run
through the queue, batches mixing N, in waves that leave room for retrieval) -> estimate
(B and P per N) -> store (every N's new version in one ``put_many``: all current or none)
-> encode.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
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
from app.observability import logs
from app.service.feedback import calibration_record
from app.service.pipeline import Pipeline
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


def _common_n(p: Pipeline, request: CalibrateRequest) -> dict[int, Labels]:
    """Without ``n``: the examples' common N (422 otherwise), after the retrieval checks."""
    sizes = {len(ex.images) for ex in request.examples}
    if len(sizes) != 1:
        raise errors.InvalidCalibration(
            f"all examples must have the same number of images N; got N in {sorted(sizes)}"
        )
    n = sizes.pop()
    labels = p.labels(n, request.labels, "examples[*].images")
    for m, ex in enumerate(request.examples):
        p.decoder.query(ex.query, where=f"examples[{m}].query")
        if ex.answer >= n:
            raise errors.InvalidCalibration(
                f"examples[{m}].answer is {ex.answer}; it must be a 0-based index < N={n}"
            )
    return {n: labels}


def _requested_n(p: Pipeline, request: CalibrateRequest) -> dict[int, Labels]:
    """With ``n``: every requested N after the same checks (each example, each N)."""
    assert request.n is not None
    candidates = min(len(ex.images) for ex in request.examples)
    sizes = requested_sizes(request.n, candidates)
    for m, ex in enumerate(request.examples):
        p.decoder.query(ex.query, where=f"examples[{m}].query")
        if ex.answer >= len(ex.images):
            raise errors.InvalidCalibration(
                f"examples[{m}].answer is {ex.answer}; it must be a 0-based index < "
                f"{len(ex.images)}, the example's number of images"
            )
        p.labels(len(ex.images), request.labels, f"examples[{m}].images")
    return {n: p.labels(n, request.labels, "n") for n in sizes}


def build_profile(
    p: Pipeline,
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
    layers = list(p.runner.layers)
    hyper = {**p.settings.method_hyperparameters(), "num_examples": num_examples, **extra}
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
        **calibration_record(stats, scores, attention, gt, p.method_config),
    )


async def _calibrate(p: Pipeline, request: CalibrateRequest, t0: float) -> CalibrateResponse:
    logs.note(profile=request.profile)
    await p.profiles.check_writable()  # before seconds of forward passes, not after
    several = request.n is not None  # several N from the same examples (design §2.9)
    labels = _requested_n(p, request) if several else _common_n(p, request)
    sizes = sorted(labels)
    fingerprints = {n: p.profiles.fingerprint(labels[n].spec, n) for n in sizes}
    logs.note(n=sizes[-1], labels=fingerprints[sizes[-1]].label_scheme)
    async with p.decoder.slot():
        decoded = await run_in_threadpool(
            lambda: [
                p.decoder.images(ex.images, f"examples[{m}].images")
                for m, ex in enumerate(request.examples)
            ]
        )
    examples = [
        (ex.query, pil, ex.answer) for ex, pil in zip(request.examples, decoded, strict=True)
    ]
    plan = multi_n_instances(examples, sizes, request.seed)
    works = [w for n in sizes for q, images in plan[n][0] for w in p.works(q, images, labels[n], 1)]
    results = iter(await p.worker.run(works, bulk=True))
    extra = {"negatives_seed": request.seed, "candidates": min(len(x[1]) for x in examples)}
    profiles = []
    for n in sizes:
        instances, gt = plan[n]
        batch = [next(results) for _ in instances]
        profiles.append(
            build_profile(
                p,
                request.profile,
                fingerprints[n],
                np.stack([r.scores for r in batch]),
                np.stack([r.attention for r in batch]),
                gt,
                len(request.examples),
                extra if several else {},
            )
        )
    stored = await p.profiles.put_many(profiles)
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
        if several
        else None
    )
    last = stored[-1]
    return CalibrateResponse(
        profile=last.name,
        version=last.version,
        model=p.model_id,
        labels=last.label_scheme,
        n=last.n,
        num_examples=last.num_examples,
        forward_passes=len(works),
        bias_matrix=last.bias_matrix,
        attention_prior=last.attention_prior,
        layers=last.layers,
        sink_layers=last.sink_layers,
        hyperparameters=last.hyperparameters,
        created_at=last.created_at,
        duration_s=round(time.perf_counter() - t0, 4),
        diagnostics=last.diagnostics,
        per_n=per_n,
    )


async def calibrate(p: Pipeline, request: CalibrateRequest) -> CalibrateResponse:
    """A calibration, counted by outcome (``invalid`` for the client's errors)."""
    t0 = time.perf_counter()
    try:
        response = await _calibrate(p, request, t0)
    except errors.ServiceError as exc:
        client_error = type(exc).status < 500 and not isinstance(exc, errors.Overloaded)
        p.metrics.calibrations.labels(outcome="invalid" if client_error else "error").inc()
        raise
    except Exception:
        p.metrics.calibrations.labels(outcome="error").inc()
        raise
    p.metrics.calibrations.labels(outcome="success").inc()
    p.metrics.calibration_duration.observe(response.duration_s)
    return response
