"""The handler between HTTP and the engine: decode -> queue -> forward -> score -> debias -> encode.

`Service` owns the runner (through one `Batcher` worker thread), the profile store and the
metrics. Routes hand it validated wire schemas and get wire schemas back; numpy arrays and
engine dataclasses never leave this module. Calibration runs its M·N rotated instances
through the same queue as retrieval, in waves of one batch, so it shares the model fairly.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from PIL import Image
from starlette.concurrency import run_in_threadpool

from app import errors
from app.decode import ImageInput, check_candidates, check_query, decode_image
from app.engine import debias
from app.engine.batcher import Batcher, BatcherStopped, QueueFull
from app.engine.labels import scheme_name
from app.engine.runner import RetrievalItem
from app.metrics import Metrics
from app.schemas import (
    NEEDS_PROFILE,
    CalibrateRequest,
    CalibrateResponse,
    ProfileRef,
    RetrieveDetails,
    RetrieveResponse,
)
from app.settings import Settings
from calibration_store import Fingerprint, Profile, ProfileKey, ProfileStore, StoreError
from calibration_store import StoreUnavailable as StoreDown

log = logging.getLogger(__name__)
LabelSpec = str | tuple[str, ...]
V = TypeVar("V")


@dataclass(frozen=True)
class Work:
    """One forward-pass item in the queue: the engine item and its label spec."""

    item: RetrievalItem
    labels: LabelSpec


@dataclass
class WorkResult:
    scores: np.ndarray  # s (N,)
    attention: np.ndarray  # a (|Λ|, N)
    forward_ms: float  # batch totals
    score_ms: float
    batch_size: int
    batch_id: int
    started: float  # perf_counter when the batch started


def _labels_key(labels: str | Sequence[str]) -> LabelSpec:
    return labels if isinstance(labels, str) else tuple(labels)


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1e3


def apply_method(
    method: str,
    s: np.ndarray,
    a: np.ndarray,
    profile: Profile | None,
    settings: Settings,
    rotated: Sequence[np.ndarray] = (),
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(probabilities, posterior π or None, debiased scores d or None) for one instance.

    `rotated` holds the scores of the N cyclic rotations (perm_avg only, rotation r first).
    """
    if method == "vanilla":
        return debias.softmax(s), None, None
    if method == "perm_avg":
        d = debias.permutation_average(list(rotated), debias.rotations(len(s)))
        return debias.softmax(d), None, d
    if profile is None:
        raise ValueError(f"method {method!r} needs a calibration profile")
    if method == "pride":
        d = debias.pride_scores(s, profile.bias_matrix_array())
        return debias.softmax(d), None, d
    posterior = debias.attention_posterior(
        a,
        profile.attention_prior_array(),
        top_k=settings.top_k,
        tau=settings.tau,
        variant=settings.posterior_variant,
    )
    if method == "attn_pure":
        return posterior, posterior, None
    d = debias.debias_scores(s, profile.bias_matrix_array(), posterior, mixture=settings.mixture)
    return debias.softmax(d), posterior, d


# ------------------------------------------------------------------------------ service
class Service:
    """One model, one queue, one store: everything the routes need."""

    def __init__(
        self, settings: Settings, runner: Any, store: ProfileStore, metrics: Metrics
    ) -> None:
        self.settings = settings
        self.runner = runner
        self.store = store
        self.metrics = metrics
        self.batcher: Batcher[Work, WorkResult] = Batcher(
            self.forward_batch,
            max_batch_size=settings.max_batch_size,
            max_wait_ms=settings.max_wait_ms,
            max_queue=settings.max_queue,
            name="lad-model-worker",
        )
        self._batch_ids = itertools.count(1)
        self._fingerprints: dict[tuple[LabelSpec, int], Fingerprint] = {}
        metrics.watch_queue(lambda: self.batcher.depth)
        metrics.watch_profiles(self._profile_rows)
        metrics.set_model_info(self.model_info())

    @property
    def model_id(self) -> str:
        return str(self.runner.model_id)

    def model_info(self) -> dict[str, Any]:
        r = self.runner
        return {
            "model_id": r.model_id, "revision": getattr(r, "revision", None),
            "dtype": str(getattr(r, "dtype", "")).removeprefix("torch."),
            "device": str(getattr(r, "device", "")),
            "attention_backend": getattr(r, "attention_backend", ""),
            "layers": ",".join(str(x) for x in r.layers),
        }  # fmt: skip

    def decode_images(self, images: Sequence[ImageInput], where: str) -> list[Image.Image]:
        """The decode stage (called off the event loop)."""
        return [decode_image(img, f"{where}[{i}]", self.settings) for i, img in enumerate(images)]

    def check_labels(self, n: int, labels: LabelSpec, where: str) -> list[str]:
        """N within limits and labels the model can score (checked before the queue)."""
        strings = check_candidates(n, labels, self.settings, where)
        try:
            self.runner.label_trie(strings)  # tokenises the labels; cached by the runner
        except ValueError as exc:
            raise errors.InvalidLabels(f"these labels cannot be scored: {exc}") from None
        return strings

    def start(self) -> None:
        self.batcher.start()

    def stop(self) -> None:
        self.batcher.stop()

    # -------------------------------------------------------------------- the worker
    def forward_batch(self, batch: list[Work]) -> list[WorkResult]:
        """Runs on the worker thread: one runner.forward per label spec in the batch."""
        self.metrics.batch_size.observe(len(batch))
        started = time.perf_counter()
        batch_id = next(self._batch_ids)
        results: list[WorkResult | None] = [None] * len(batch)
        groups: dict[LabelSpec, list[int]] = {}
        for i, work in enumerate(batch):
            groups.setdefault(work.labels, []).append(i)
        for labels, idx in groups.items():
            out = self.runner.forward([batch[i].item for i in idx], labels=labels)
            for j, i in enumerate(idx):
                results[i] = WorkResult(
                    scores=np.asarray(out.scores[j], dtype=np.float64),
                    attention=np.asarray(out.attention[j], dtype=np.float64),
                    forward_ms=float(out.timings_ms.get("forward", 0.0)),
                    score_ms=float(out.timings_ms.get("score", 0.0)),
                    batch_size=len(batch), batch_id=batch_id, started=started,
                )  # fmt: skip
        return [r for r in results if r is not None]

    async def _submit_all(self, works: Sequence[Work], *, bulk: bool) -> list[WorkResult]:
        """Queue works and wait (429 only if the first finds the queue full); bulk work goes
        in waves of one batch, so that calibration leaves room for retrieval traffic."""
        try:
            if not bulk:
                return list(
                    await asyncio.gather(
                        *(self.batcher.submit(w, wait_for_room=i > 0) for i, w in enumerate(works))
                    )
                )
            out: list[WorkResult] = []
            wave = self.settings.max_batch_size
            for start in range(0, len(works), wave):
                chunk = works[start : start + wave]
                out += await asyncio.gather(
                    *(self.batcher.submit(w, wait_for_room=True) for w in chunk)
                )
            return out
        except (QueueFull, BatcherStopped, errors.ServiceError):
            raise
        except Exception as exc:
            log.exception("the model failed on a request")
            raise errors.EngineFailure(
                f"the model failed on this request ({type(exc).__name__}: {exc})"
            ) from exc

    # -------------------------------------------------------------------- profiles
    def fingerprint(self, labels: LabelSpec, n: int) -> Fingerprint:
        key = (labels, n)
        if key not in self._fingerprints:
            self._fingerprints[key] = Fingerprint.of(self.runner.fingerprint(labels, n))
        return self._fingerprints[key]

    def key(self, name: str, labels: str, n: int) -> ProfileKey:
        return ProfileKey(model_id=self.model_id, name=name, label_scheme=labels, n=n)

    async def store_call(self, operation: str, fn: Callable[..., V], *args: Any) -> V:
        """A store call off the event loop; failures counted by operation and translated."""
        try:
            return await run_in_threadpool(fn, *args)
        except StoreError as exc:
            if isinstance(exc, StoreDown):
                self.metrics.store_errors.labels(operation=operation).inc()
            raise errors.translate(exc) or errors.StoreUnavailable(str(exc)) from exc

    def _profile_rows(self) -> Iterator[tuple[str, str, int, int, float]]:
        for key in self.store.list_keys(self.model_id):
            profile = self.store.get(key)
            if profile is not None:
                ts = profile.created_at.timestamp() if profile.created_at else 0.0
                yield key.name, key.label_scheme, key.n, profile.version, ts

    def profile_for(self, name: str, labels: LabelSpec, n: int) -> Profile | None:
        """The current profile for (model, name, labels, N), checked against the engine."""
        fp = self.fingerprint(labels, n)
        profile = self.store.get(self.key(name, fp.label_scheme, n))  # in-memory copy
        if profile is None:
            return None
        diff = profile.fingerprint.mismatches(fp)
        if diff or list(profile.layers) != list(self.runner.layers):
            if list(profile.layers) != list(self.runner.layers):
                diff["layers"] = (list(profile.layers), list(self.runner.layers))
            what = ", ".join(f"{k}: profile {a!r} vs engine {b!r}" for k, (a, b) in diff.items())
            raise errors.ProfileMismatch(
                f"profile {name!r} v{profile.version} (labels {fp.label_scheme}, N={n}) was "
                f"calibrated under a different engine ({what}); recalibrate with "
                "POST /v1/calibrate"
            )
        return profile

    # -------------------------------------------------------------------- retrieve
    async def retrieve(
        self,
        *,
        query: str,
        images: Sequence[ImageInput],
        method: str,
        profile: str,
        labels: str | Sequence[str],
        return_details: bool,
    ) -> RetrieveResponse:
        t0 = time.perf_counter()
        label_spec = _labels_key(labels)
        check_query(query, self.settings)
        label_strings = self.check_labels(len(images), label_spec, "images")
        n = len(images)
        pil = await run_in_threadpool(self.decode_images, images, "images")
        stored = None
        if method in NEEDS_PROFILE:
            stored = self.profile_for(profile, label_spec, n)
            if stored is None and not self.settings.fallback_to_vanilla:
                raise errors.CalibrationRequired(
                    f"no calibration for model {self.model_id!r}, profile {profile!r}, "
                    f"labels {scheme_name(label_spec)!r} and N={n}: POST /v1/calibrate with "
                    f'{{"profile": "{profile}", "examples": [...]}} holding 1-64 '
                    f"(5 recommended) examples of {n} images each with their answer, or use "
                    'method "vanilla" or "perm_avg"'
                )
            if stored is None:
                method = "vanilla"
        timings = {"decode": _ms(t0)}

        submitted = time.perf_counter()
        orders = debias.rotations(n) if method == "perm_avg" else [list(range(n))]
        works = [Work(RetrievalItem(query, [pil[p] for p in o]), label_spec) for o in orders]
        results = await self._submit_all(works, bulk=False)
        first = min(r.started for r in results)
        batches = {r.batch_id: r for r in results}.values()
        timings["queue"] = max(0.0, (first - submitted) * 1e3)
        timings["forward"] = sum(r.forward_ms for r in batches)
        timings["score"] = sum(r.score_ms for r in batches)

        t1 = time.perf_counter()
        s, a = results[0].scores, results[0].attention
        probs, posterior, debiased_scores = apply_method(
            method, s, a, stored, self.settings, rotated=[r.scores for r in results]
        )
        index = int(np.argmax(probs))
        timings["debias"] = _ms(t1)

        t2 = time.perf_counter()
        debiased = method != "vanilla"
        self.metrics.predicted_position.labels(
            method=method, position=str(int(np.argmax(s))), kind="raw"
        ).inc()
        if debiased:
            self.metrics.predicted_position.labels(
                method=method, position=str(index), kind="debiased"
            ).inc()
        details = None
        if return_details:
            details = RetrieveDetails(
                labels=label_strings, scores=s.tolist(),
                debiased_scores=None if debiased_scores is None else debiased_scores.tolist(),
                attention=a.tolist(), layers=list(self.runner.layers),
                batch_size=results[0].batch_size,
            )  # fmt: skip
        response = RetrieveResponse(
            index=index, label=label_strings[index], probabilities=probs.tolist(),
            raw_probabilities=debias.softmax(s).tolist(),
            posterior=None if posterior is None else posterior.tolist(),
            method=method, debiased=debiased,
            profile=ProfileRef(name=stored.name, version=stored.version) if stored else None,
            model=self.model_id, timings_ms=timings, details=details,
        )  # fmt: skip
        timings["encode"] = response.timings_ms["encode"] = _ms(t2)
        self._observe(timings, results)
        return response

    def _observe(self, timings: dict[str, float], results: list[WorkResult]) -> None:
        """Stage latencies, and the overhead ratio on this request's share of its batches."""
        self.metrics.observe_stages(timings)
        forward = sum(r.forward_ms / r.batch_size for r in results)
        score = sum(r.score_ms / r.batch_size for r in results)
        if forward > 0:
            self.metrics.debias_overhead.observe((score + timings["debias"]) / forward)

    # -------------------------------------------------------------------- calibrate
    async def calibrate(self, request: CalibrateRequest) -> CalibrateResponse:
        t0 = time.perf_counter()
        try:
            response = await self._calibrate(request, t0)
        except errors.ServiceError as exc:
            client_error = errors.status_of(exc) < 500 and not isinstance(exc, errors.Overloaded)
            self.metrics.calibrations.labels(outcome="invalid" if client_error else "error").inc()
            raise
        except Exception:
            self.metrics.calibrations.labels(outcome="error").inc()
            raise
        self.metrics.calibrations.labels(outcome="success").inc()
        self.metrics.calibration_duration.observe(response.duration_s)
        return response

    async def _calibrate(self, request: CalibrateRequest, t0: float) -> CalibrateResponse:
        label_spec = _labels_key(request.labels)
        sizes = {len(ex.images) for ex in request.examples}
        if len(sizes) != 1:
            raise errors.InvalidCalibration(
                f"all examples must have the same number of images N; got N in {sorted(sizes)}"
            )
        n = sizes.pop()
        self.check_labels(n, label_spec, "examples[*].images")
        for m, ex in enumerate(request.examples):
            check_query(ex.query, self.settings, where=f"examples[{m}].query")
            if ex.answer >= n:
                raise errors.InvalidCalibration(
                    f"examples[{m}].answer is {ex.answer}; it must be a 0-based index < N={n}"
                )
        fp = self.fingerprint(label_spec, n)
        decoded = await run_in_threadpool(
            lambda: [
                self.decode_images(ex.images, f"examples[{m}].images")
                for m, ex in enumerate(request.examples)
            ]
        )
        works, gt = [], []
        for ex, pil in zip(request.examples, decoded, strict=True):
            for shift in range(n):
                works.append(Work(RetrievalItem(ex.query, debias.rotate(pil, shift)), label_spec))
                gt.append(debias.rotated_position(ex.answer, shift, n))
        results = await self._submit_all(works, bulk=True)
        scores = np.stack([r.scores for r in results])
        attention = np.stack([r.attention for r in results])
        bias_matrix = debias.estimate_bias_matrix(scores, np.asarray(gt))
        prior = debias.estimate_attention_prior(attention)
        hyper = {**self.settings.method_hyperparameters(), "num_examples": len(request.examples)}
        profile = Profile.create(
            name=request.profile, fingerprint=fp, layers=list(self.runner.layers),
            bias_matrix=bias_matrix, attention_prior=prior,
            num_examples=len(request.examples), num_forward_passes=len(works),
            hyperparameters=hyper,
        )  # fmt: skip
        stored = await self.store_call("put", self.store.put, profile)
        return CalibrateResponse(
            profile=stored.name, version=stored.version, model=self.model_id,
            labels=stored.label_scheme, n=n, num_examples=len(request.examples),
            forward_passes=len(works), bias_matrix=stored.bias_matrix,
            attention_prior=stored.attention_prior, layers=stored.layers,
            hyperparameters=stored.hyperparameters, created_at=stored.created_at,
            duration_s=round(time.perf_counter() - t0, 4),
        )  # fmt: skip
