"""The model worker: one queue, one thread, dynamic batches through the runner.

Everything that reaches the model goes through ``ModelWorker.run``: retrieval instances
and calibration instances alike, so calibration shares the model fairly with traffic;
admin work (calibrations) holds at most one wave of the queue, however many run at once.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app import errors
from app.engine.batcher import Batcher, BatcherStopped, QueueFull
from app.engine.host_memory import ReleaseSchedule
from app.engine.interface import PromptTooLongError, RetrievalItem, RunnerLike
from app.engine.labels import LabelSpec
from app.observability import tracing
from app.observability.metrics import Metrics
from app.observability.request_context import log_unexpected, mark_stage
from app.service.shadow import ShadowSampler
from app.settings import Settings


@dataclass(frozen=True)
class Work:
    """One forward-pass instance in the queue: the engine item, which carries its labels as
    the decode stage resolved them (the runner reads them; nothing resolves them again)."""

    item: RetrievalItem

    @property
    def spec(self) -> LabelSpec:
        """The labels value as sent: instances that share it share a forward call (their
        N may differ, as rerank's windows do)."""
        assert self.item.labels is not None, "a Work carries resolved labels"
        return self.item.labels.spec


@dataclass
class WorkResult:
    """The evidence of one instance, with the timings of the batch it ran in. ``scores`` and
    ``attention`` are float64 from here on (cast once, in ``forward_batch``)."""

    scores: np.ndarray  # s (N,)
    attention: np.ndarray  # a (|Λ|, N)
    forward_ms: float  # batch totals
    score_ms: float
    batch_size: int
    batch_id: int
    started: float  # perf_counter when the batch started
    prompt_tokens: int | None = None  # tokens of this instance's prompt, images included
    process_ms: float = 0.0  # the processor's time for the batch (apart from forward_ms)


class ModelWorker:
    """The batcher around the runner; ``run`` submits instances and awaits their evidence."""

    def __init__(self, runner: RunnerLike, settings: Settings, metrics: Metrics) -> None:
        self.runner = runner
        self.metrics = metrics
        # retention: freed memory goes back when idle and, under traffic, on this schedule
        self.release = (
            ReleaseSchedule(
                settings.host_memory_trim_every_s, int(settings.host_memory_trim_above_mb * 2**20)
            )
            if settings.host_memory_retain_s > 0
            else None
        )
        self.batcher: Batcher[Work, WorkResult] = Batcher(
            self.forward_batch,
            max_batch_size=settings.max_batch_size,
            max_wait_ms=settings.max_wait_ms,
            max_queue=settings.max_queue,
            name="lad-model-worker",
            on_idle=self.release.release if self.release else None,
            idle_after_s=settings.host_memory_retain_s or 1.0,
        )
        self._batch_ids = itertools.count(1)
        self._bulk_turn = asyncio.Lock()  # one wave of admin work in the queue at a time
        self.shadow = ShadowSampler(runner, metrics, settings.overhead_sample_rate)
        metrics.watch_queue(lambda: self.batcher.depth, settings.max_queue)

    @property
    def bulk_wave(self) -> int:
        """Instances of admin work queued at once: one batch, at most half the queue."""
        return max(1, min(self.batcher.max_batch_size, self.batcher.max_queue // 2))

    @property
    def running(self) -> bool:
        return self.batcher.running

    def start(self) -> None:
        self.batcher.start()
        self.shadow.start()

    def stop(self) -> None:
        self.batcher.stop()
        self.shadow.stop()

    def forward_batch(self, batch: list[Work]) -> list[WorkResult]:
        """Runs on the worker thread: one runner.forward per label spec in the batch."""
        self.metrics.batch_size.observe(len(batch))
        started = time.perf_counter()
        batch_id = next(self._batch_ids)
        results: list[WorkResult | None] = [None] * len(batch)
        groups: dict[LabelSpec, list[int]] = {}
        for i, work in enumerate(batch):
            groups.setdefault(work.spec, []).append(i)
        for labels, idx in groups.items():
            out = self.runner.forward([batch[i].item for i in idx], labels=labels)
            if self.shadow.rate > 0:  # no sampler, no call
                self.shadow.offer([batch[i].item for i in idx], labels, out.timings_ms)
            tokens = out.prompt_tokens or [None] * len(idx)
            for j, i in enumerate(idx):
                results[i] = WorkResult(
                    scores=np.asarray(out.scores[j], dtype=np.float64),
                    attention=np.asarray(out.attention[j], dtype=np.float64),
                    forward_ms=float(out.timings_ms.get("forward", 0.0)),
                    score_ms=float(out.timings_ms.get("score", 0.0)),
                    batch_size=len(batch),
                    batch_id=batch_id,
                    started=started,
                    prompt_tokens=tokens[j],
                    process_ms=float(out.timings_ms.get("process", 0.0)),
                )
        if self.release is not None:
            self.release.after_batch()
        return [r for r in results if r is not None]

    async def run(self, works: Sequence[Work], *, bulk: bool) -> list[WorkResult]:
        """Queue works and wait for all of them.

        A request's works are admitted all or none (429 when the queue has no room for all
        of them), and when one fails the rest are cancelled, so a refused request costs no
        forward pass. Bulk work (calibration) goes in waves of one batch that wait for room,
        so that it leaves room for retrieval traffic: however many calibrations and refreshes
        run at once, only one wave of them is queued at any moment (they take turns, in
        order), and a wave is at most half the queue, so a retrieve is never refused for
        admin work. A failure inside the model becomes ``EngineFailure`` (details in the
        log, not in the answer).
        """
        try:
            if not bulk:
                with mark_stage("queue"):  # a client that leaves now takes its passes off the queue
                    out = await _gather(self.batcher.submit_many(works))
            else:
                out = []
                wave = self.bulk_wave
                for start in range(0, len(works), wave):
                    async with self._bulk_turn:
                        out += await _gather(await self._admit(works[start : start + wave]))
            tracing.note_batches((r.batch_id, r.batch_size) for r in out)
            return out
        except (QueueFull, BatcherStopped, errors.ServiceError):
            raise
        except PromptTooLongError as exc:  # refused before any forward: the client's to fix
            raise errors.PromptTooLong(str(exc)) from None
        except Exception as exc:
            log_unexpected(exc, "the model failed on a request")
            raise errors.EngineFailure(
                "the model failed on this request; the server log has the details under "
                "this request_id"
            ) from exc

    async def _admit(self, works: Sequence[Work]) -> list[asyncio.Future]:
        """Admit a wave all at once, waiting (with backoff) until the queue has room."""
        delay = 0.001
        while True:
            try:
                return self.batcher.submit_many(works)
            except QueueFull:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.05)


async def _gather(futures: list[asyncio.Future]) -> list[WorkResult]:
    """All results in order; on the first failure (or cancellation) cancel the others."""
    try:
        return list(await asyncio.gather(*futures))
    except BaseException:
        for future in futures:
            future.cancel()
        raise
