"""``lad eval --url URL``: the harness on a running service (or a fleet behind a load
balancer) instead of an in-process model.

``RemoteBackend`` stands where a loaded runner stands in ``run_evaluation``: ``forward``
sends each instance once to ``POST /v1/retrieve`` with ``return_details`` (method
vanilla: no profile needed) and returns the scores s and attention a the service computed,
so every one-pass method (vanilla, pride, attn_raw, attn_pure, agd) is applied here by the
same engine code to one forward per instance; perm_avg sends its other orders the same
way. Calibration goes through the service's own ``POST /v1/calibrate`` (its B and P are
used; the evidence of the rotated instances is fetched too, for calibration.json).
Requests run ``concurrency`` at a time with the client's retries (429 / 503 / refused
connections, ``lad_client``), so an evaluation scales with the replicas behind the URL.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from app.method.calibrate import Calibration
from lad_client import LadClient

PROFILE = "lad-eval"
"""The profile name ``--url`` calibrates (one version per run and N)."""


@dataclass
class RemoteForward:
    scores: np.ndarray  # (B, N)
    attention: np.ndarray  # (B, |Λ|, N)


class RemoteBackend:
    """A service behind ``client`` as an evaluation backend (see the module docstring)."""

    def __init__(
        self,
        client: LadClient,
        *,
        concurrency: int = 8,
        profile: str = PROFILE,
        model_id: str = "remote",
    ) -> None:
        if concurrency < 1:
            raise ValueError("--concurrency must be >= 1")
        self.client, self.concurrency, self.profile = client, concurrency, profile
        self.model_id = model_id
        self._layers: tuple[int, ...] | None = None

    @property
    def layers(self) -> tuple[int, ...]:
        """Λ of the served model (one probe request the first time, if no answer came yet)."""
        if self._layers is None:
            probe = [Image.new("RGB", (56, 56), (k * 90, 60, 120)) for k in range(2)]
            self._details("probe", probe, "digits")
        assert self._layers is not None
        return self._layers

    def _details(self, query: str, images: Sequence[Any], labels: Any) -> Any:
        answer = self.client.retrieve(
            query, images, method="vanilla", labels=labels, return_details=True
        )
        if answer.details is None or answer.details.attention is None:
            raise RuntimeError("the service returned no evidence (details.attention)")
        self._layers = tuple(answer.details.layers)
        self.model_id = answer.model
        return answer.details

    def forward(self, items: Sequence[Any], labels: Any = "digits") -> RemoteForward:
        """One /v1/retrieve per item, ``concurrency`` at a time, answers in item order."""
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            details = list(pool.map(lambda it: self._details(it.query, it.images, labels), items))
        return RemoteForward(
            np.asarray([d.scores for d in details], dtype=np.float64),
            np.asarray([d.attention for d in details], dtype=np.float64),
        )

    def service_calibration(
        self, examples: Sequence[tuple[str, Sequence[Any], int]], labels: Any
    ) -> Calibration:
        """B and P from the service's own /v1/calibrate on these (query, images, answer)."""
        done = self.client.calibrate(examples, profile=self.profile, labels=labels)
        self._layers = tuple(done.layers)
        return Calibration(
            np.asarray(done.bias_matrix, dtype=np.float64),
            np.asarray(done.attention_prior, dtype=np.float64),
        )
