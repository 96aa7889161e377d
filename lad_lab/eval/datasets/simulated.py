"""A seeded score-level SIMULATION of the paper's regime, as a dataset plus its backend.

Not a model: ``SimulatedBackend.forward`` returns label scores s and attention evidence
a^(l) computed from each item's latent candidates and the order they are shown in, so that
``lad eval --dataset simulated`` runs the same calibration (``app.method.calibrate``) and
method code (``app.method.methods``) as the service, and the method's stages can be seen
where the demo model cannot show them (design §4). Everything it reports is a simulation.

The regime (defaults in ``SimParams``), for GT at position t among N:

- scores: s = log_softmax(b[t, j] + gamma·[j = t] + c_j + sigma_s·z_j): every position
  carries content (the GT gain gamma and a per-candidate content term c shared by all
  orderings of an item), plus a *conditional* position bias b[t, ·] (edges preferred, and
  the GT's own position penalised when the GT sits in the middle).
- attention over a real depth of Λ (``depth`` layers, e.g. 15): a^(l)_k = m_l · prior_l[k]
  · exp(kappa_l·[k = t] + sigma_a·z_lk) / Σ, with a positional prior per layer (skewed to
  the first image), a few informative layers (large kappa and image mass m_l, so that the
  top-K selection finds them most of the time) and noise partly shared across layers, so
  that attention is informative but imperfect.

The noise of an instance depends only on (item, shown order): like a model, the backend is
a deterministic function of its input.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lad_lab.eval.datasets.base import EvalItem, check_setting

SIM_LAYERS_OFFSET = 21
"""Λ of the simulated model: layers 21 .. 21 + depth - 1 (the paper's 21..35 at depth 15)."""


@dataclass(frozen=True)
class SimParams:
    """The simulated regime (see the module docstring)."""

    depth: int = 15
    informative: tuple[int, ...] = (6, 9, 12)  # indices into Λ
    gamma: float = 2.4  # the GT's logit gain
    content: float = 1.1  # std of the per-candidate content term (shared by orderings)
    sigma_s: float = 0.8  # per-instance logit noise
    edge_bias: tuple[float, float] = (1.3, 0.7)  # logit bias of the first and last position
    middle_penalty: float = 0.8  # a middle GT's own position loses this much (conditional)
    kappa: float = 1.5  # attention gain of the GT in informative layers
    kappa_other: float = 0.25  # ... in the other layers
    mass: float = 0.55  # image attention mass of informative layers
    mass_other: float = 0.3
    sigma_a: float = 1.0  # attention noise
    shared_noise: float = 0.6  # correlation of the attention noise across layers
    first_prior: float = 0.6  # prior mass of the first image (the rest: last 0.2, middle)
    adversarial_gain: float = 0.7  # the adversarial setting scales gamma and kappa by this


@dataclass(frozen=True)
class SimCandidate:
    """One latent candidate: which item, which original index, and whether it matches."""

    item: str
    index: int
    target: bool
    content: float
    gain: float  # scales the GT's logit and attention gains (adversarial: < 1)


def _rng(*parts: Any) -> np.random.Generator:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


class SimulatedDataset:
    """Items of N latent candidates (random / adversarial: a smaller visual gain)."""

    name = "simulated"
    settings: tuple[str, ...] = ("random", "adversarial")

    def __init__(self, params: SimParams | None = None) -> None:
        self.params = params or SimParams()

    def items(
        self, count: int, n: int, setting: str, seed: int, exclude: frozenset[str] = frozenset()
    ) -> list[EvalItem]:
        check_setting(self, setting)
        out: list[EvalItem] = []
        index = 0
        while len(out) < count:
            key = f"simulated/{setting}/{seed}/{index}"
            index += 1
            if key in exclude:
                continue
            rng = _rng(key, n)
            answer = int(rng.integers(n))
            content = rng.normal(0.0, self.params.content, n)
            gain = self.params.adversarial_gain if setting == "adversarial" else 1.0
            candidates = [
                SimCandidate(key, k, k == answer, float(content[k]), gain) for k in range(n)
            ]
            out.append(EvalItem(key, f"simulated {setting}", candidates, answer, key))
        return out


@dataclass
class SimForward:
    scores: np.ndarray  # (B, N)
    attention: np.ndarray  # (B, |Λ|, N)


@dataclass
class SimulatedBackend:
    """Stands where a loaded runner stands in ``run_evaluation`` (forward and layers only)."""

    params: SimParams = field(default_factory=SimParams)
    model_id: str = "simulation"
    _priors: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(range(SIM_LAYERS_OFFSET, SIM_LAYERS_OFFSET + self.params.depth))

    def bias(self, n: int) -> np.ndarray:
        """b (N, N): rows = GT position, the conditional position bias of the logits."""
        p = self.params
        base = np.zeros(n)
        base[0], base[-1] = p.edge_bias if n > 1 else (0.0, 0.0)
        b = np.tile(base, (n, 1))
        for t in range(1, n - 1):
            b[t, t] -= p.middle_penalty
        return b

    def priors(self, n: int) -> np.ndarray:
        """(|Λ|, N) attention prior of each layer: first-heavy, varying by layer."""
        if n not in self._priors:
            self._priors[n] = self._draw_priors(n)
        return self._priors[n]

    def _draw_priors(self, n: int) -> np.ndarray:
        p = self.params
        base = np.full(n, (1.0 - p.first_prior - 0.2) / max(n - 2, 1)) if n > 2 else np.ones(n)
        if n > 2:
            base[0], base[-1] = p.first_prior, 0.2
        base = base / base.sum()
        rng = _rng("priors", n, p)
        return np.stack([rng.dirichlet(60.0 * base) for _ in range(p.depth)])

    def forward(self, items: Any, labels: Any = "digits") -> SimForward:
        scores, attention = [], []
        for item in items:
            s, a = self._instance(list(item.images))
            scores.append(s)
            attention.append(a)
        return SimForward(np.stack(scores), np.stack(attention))

    def _instance(self, shown: list[SimCandidate]) -> tuple[Any, Any]:
        p = self.params
        n = len(shown)
        t = next(k for k, c in enumerate(shown) if c.target)
        rng = _rng(shown[0].item, tuple(c.index for c in shown))
        scale = shown[t].gain
        gt = np.eye(n)[t]
        content = np.array([c.content for c in shown])
        logits = self.bias(n)[t] + scale * p.gamma * gt + content + p.sigma_s * rng.normal(size=n)
        s = logits - np.logaddexp.reduce(logits)
        informative = np.isin(np.arange(p.depth), p.informative)
        kappa = np.where(informative, p.kappa, p.kappa_other)[:, None] * scale
        mass = np.where(informative, p.mass, p.mass_other)[:, None]
        shared = rng.normal(size=n)
        noise = p.shared_noise * shared + np.sqrt(1 - p.shared_noise**2) * rng.normal(
            size=(p.depth, n)
        )
        weights = self.priors(n) * np.exp(kappa * gt + p.sigma_a * noise)
        mass = mass * np.exp(0.15 * rng.normal(size=(p.depth, 1)))
        return s, mass * weights / weights.sum(axis=1, keepdims=True)
