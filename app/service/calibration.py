"""Calibration of several N from one set of examples (design §2.9), and the profile a
calibration's evidence becomes (shared with the one-N calibration of ``core``).

Every N's instances go through the queue together (one bulk run, batches mixing N), so
the forward passes are M·ΣN and the batching is the same as for one N; the profiles of
all N are stored in one ``put_many``: all versions become current, or none does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal, Protocol

import numpy as np
from starlette.concurrency import run_in_threadpool

from app import errors, logs
from app.decode import Decoder
from app.engine.calibrate import (
    CalibrationStats,
    estimate_from_stats,
    multi_n_instances,
    raw_position_share,
)
from app.engine.interface import RetrievalItem, RunnerLike
from app.engine.labels import LabelSpec, label_spec
from app.engine.methods import MethodConfig
from app.service.feedback import calibration_record
from app.service.profiles import ProfileService
from app.service.worker import ModelWorker, Work
from app.settings import Settings
from calibration_store import Fingerprint, Profile
from lad_client.types import CalibratedN, CalibrateRequest, CalibrateResponse


class Service(Protocol):
    """The part of ``app.service.core.Service`` a calibration uses (no import cycle)."""

    settings: Settings
    runner: RunnerLike
    decoder: Decoder
    profiles: ProfileService
    worker: ModelWorker

    method_config: MethodConfig

    @property
    def model_id(self) -> str: ...

    def check_labels(self, n: int, labels: LabelSpec, where: str) -> list[str]: ...


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


def build_profile(
    service: Service,
    name: str,
    fingerprint: Fingerprint,
    scores: np.ndarray,
    attention: np.ndarray,
    gt: np.ndarray,
    num_examples: int,
    extra: dict[str, object] | None = None,
) -> Profile:
    """The profile of one N from its rotated instances' evidence: B and P, the raw position
    share, and what online calibration keeps (offline sums, provenance, diagnostics)."""
    stats = CalibrationStats.from_evidence(scores, attention, gt)
    calibration = estimate_from_stats(stats)
    layers = list(service.runner.layers)
    hyper = {**service.settings.method_hyperparameters(), "num_examples": num_examples,
             **(extra or {})}  # fmt: skip
    return Profile.create(
        name=name, fingerprint=fingerprint, layers=layers,
        bias_matrix=calibration.bias_matrix, attention_prior=calibration.attention_prior,
        num_examples=num_examples, num_forward_passes=len(scores), hyperparameters=hyper,
        calibration_position_share=raw_position_share(scores),
        sink_layers=[layers[i] for i in calibration.sink_layers],
        **calibration_record(stats, scores, attention, gt, service.method_config),
    )  # fmt: skip


def calibrated_response(
    service: Service, stored: Profile, forward_passes: int, t0: float,
    per_n: list[CalibratedN] | None = None,
) -> CalibrateResponse:  # fmt: skip
    """The wire answer for a stored profile (the largest N of a multi-N calibration)."""
    return CalibrateResponse(
        profile=stored.name, version=stored.version, model=service.model_id,
        labels=stored.label_scheme, n=stored.n, num_examples=stored.num_examples,
        forward_passes=forward_passes, bias_matrix=stored.bias_matrix,
        attention_prior=stored.attention_prior, layers=stored.layers,
        sink_layers=stored.sink_layers, hyperparameters=stored.hyperparameters,
        created_at=stored.created_at, duration_s=round(time.perf_counter() - t0, 4),
        diagnostics=stored.diagnostics, per_n=per_n,
    )  # fmt: skip


def _check(service: Service, request: CalibrateRequest, spec: LabelSpec) -> list[int]:
    """The requested N after the same checks as retrieval (each N, each example)."""
    assert request.n is not None
    candidates = min(len(ex.images) for ex in request.examples)
    sizes = requested_sizes(request.n, candidates)
    for m, ex in enumerate(request.examples):
        service.decoder.query(ex.query, where=f"examples[{m}].query")
        if ex.answer >= len(ex.images):
            raise errors.InvalidCalibration(
                f"examples[{m}].answer is {ex.answer}; it must be a 0-based index < "
                f"{len(ex.images)}, the example's number of images"
            )
        service.check_labels(len(ex.images), spec, f"examples[{m}].images")
    for n in sizes:
        service.check_labels(n, spec, "n")
    return sizes


async def calibrate_sizes(
    service: Service, request: CalibrateRequest, t0: float
) -> CalibrateResponse:
    """One profile version per requested N from the same examples, stored all or none."""
    spec = label_spec(request.labels)
    logs.note(profile=request.profile)
    sizes = _check(service, request, spec)
    fingerprints = {n: service.profiles.fingerprint(spec, n) for n in sizes}
    logs.note(n=sizes[-1], labels=fingerprints[sizes[-1]].label_scheme)
    async with service.decoder.slot():
        decoded = await run_in_threadpool(
            lambda: [
                service.decoder.images(ex.images, f"examples[{m}].images")
                for m, ex in enumerate(request.examples)
            ]
        )
    examples = [
        (ex.query, pil, ex.answer) for ex, pil in zip(request.examples, decoded, strict=True)
    ]
    plan = multi_n_instances(examples, sizes, request.seed)
    works = [Work(RetrievalItem(q, images), spec) for n in sizes for q, images in plan[n][0]]
    results = iter(await service.worker.run(works, bulk=True))
    profiles, passes = [], {}
    for n in sizes:
        instances, gt = plan[n]
        batch = [next(results) for _ in instances]
        scores = np.stack([r.scores for r in batch])
        attention = np.stack([r.attention for r in batch])
        passes[n] = len(instances)
        profiles.append(build_profile(
            service, request.profile, fingerprints[n], scores, attention, gt,
            len(request.examples), {"negatives_seed": request.seed,
                                    "candidates": min(len(ex.images) for ex in request.examples)},
        ))  # fmt: skip
    stored = await service.profiles.put_many(profiles)
    logs.note(version=stored[-1].version)
    per_n = [
        CalibratedN(n=p.n, version=p.version, forward_passes=passes[p.n],
                    bias_matrix=p.bias_matrix, attention_prior=p.attention_prior,
                    sink_layers=p.sink_layers)
        for p in stored
    ]  # fmt: skip
    return calibrated_response(service, stored[-1], len(works), t0, per_n)
