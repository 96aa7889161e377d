"""The live "latency overhead of debiasing": a sampled shadow forward without capture.

AGD reads its attention evidence inside the one forward a plain model would run anyway;
what it adds there (the t_q row per layer of Λ, the span sums) cannot be timed apart from
the forward. So a fraction ``LAD_OVERHEAD_SAMPLE_RATE`` of batches is run a second time,
plainly (the same processed prompt, same folding, nothing captured), and

    overhead = (forward with capture - plain forward) / (plain forward + score)

is observed in ``lad_debias_latency_overhead_ratio``: the extra latency of the evidence
relative to what a vanilla answer costs (its forward and its label scores). The debias
math itself is the ``debias`` stage of ``lad_stage_duration_seconds``.

Accounting: the shadow runs on its own thread after the batch's answers are out, so it
never delays the requests it measures; it takes the model lock like any batch, so the
next batch may wait one plain forward. Its model time is ``lad_shadow_forward_seconds``.
At most one shadow waits at a time; samples that arrive meanwhile are skipped.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import Sequence
from typing import Any

from app.engine.interface import RetrievalItem
from app.engine.labels import LabelSpec
from app.observability.metrics import Metrics

log = logging.getLogger(__name__)
_STOP = object()


def overhead_ratio(captured_ms: dict[str, float], plain_ms: dict[str, float]) -> float:
    """(forward with capture - plain forward) / (plain forward + score), from the live
    batch's timings and the shadow's. When the live ``forward`` includes the processor
    call (no separate ``process`` timing), the plain side includes it too."""
    plain = plain_ms["forward"]
    if "process" not in captured_ms:
        plain += plain_ms["process"]
    denominator = plain + captured_ms.get("score", 0.0)
    if denominator <= 0:
        raise ValueError("the plain forward took no time")
    return (captured_ms["forward"] - plain) / denominator


class ShadowSampler:
    """Samples batches and measures them again without capture, on its own thread."""

    def __init__(self, runner: Any, metrics: Metrics, rate: float, seed: int | None = None) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"the sample rate must be in [0, 1], got {rate}")
        self.runner = runner
        self.metrics = metrics
        self.rate = rate
        self._random = random.Random(seed)
        self._pending: queue.Queue = queue.Queue(maxsize=1)
        self._thread: threading.Thread | None = None
        self.measured = 0

    @property
    def enabled(self) -> bool:
        return self.rate > 0 and hasattr(self.runner, "plain_forward_ms")

    def start(self) -> None:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._work, name="lad-shadow", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        while True:  # a waiting sample is dropped, the stop sentinel takes its place
            try:
                self._pending.get_nowait()
            except queue.Empty:
                break
        self._pending.put(_STOP)
        thread.join(timeout)

    def offer(
        self, items: Sequence[RetrievalItem], labels: LabelSpec, timings_ms: dict[str, float]
    ) -> bool:
        """Called by the worker after a live batch: queue it for a shadow run if sampled."""
        if self._thread is None or self._random.random() >= self.rate:
            return False
        try:
            self._pending.put_nowait((list(items), labels, dict(timings_ms)))
        except queue.Full:
            return False
        return True

    def _work(self) -> None:
        while True:
            job = self._pending.get()
            if job is _STOP:
                return
            items, labels, captured = job
            try:
                plain = self.runner.plain_forward_ms(items, labels)
                ratio = overhead_ratio(captured, plain)
            except Exception:
                log.exception("the shadow forward failed; the overhead sample is skipped")
                continue
            self.metrics.shadow_forward.observe(plain["forward"] / 1e3)
            self.metrics.debias_latency_overhead.observe(ratio)
            self.measured += 1
