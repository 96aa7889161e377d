"""The engine of ``lad eval rerank``: the evidence cache (forwards shared between methods
and tournaments that show the same images in the same order), one ``n: "all"`` calibration
for every window size, one item's tournament played as the service plays it, and the
paired differences and CI text its reports share."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from app.engine.interface import RetrievalItem
from app.method.calibrate import Calibration, estimate_calibration, multi_n_instances
from app.method.methods import MethodConfig, apply_method, passes
from app.method.tournament import Tournament
from lad_lab.eval.datasets import EvalItem, open_image
from lad_lab.eval.stats import mean_ci


class Evidence:
    """Forward passes of one runner, cached by (item, images in position order), so that
    methods sharing a window share its forward; ``computed`` counts real forwards."""

    def __init__(self, runner: Any, batch_size: int, labels: str = "digits") -> None:
        self.runner, self.batch_size, self.labels = runner, batch_size, labels
        self.cache: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}
        self.computed = 0

    def get(
        self, requests: Sequence[tuple[tuple[Any, ...], str, list[Any]]]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """(key, query, images) -> (s, a) each, computing the missing ones in batches."""
        missing = list({key: (q, ims) for key, q, ims in requests if key not in self.cache}.items())
        for start in range(0, len(missing), self.batch_size):
            chunk = missing[start : start + self.batch_size]
            out = self.runner.forward([RetrievalItem(q, ims) for _, (q, ims) in chunk], self.labels)
            for (key, _), s, a in zip(chunk, out.scores, out.attention, strict=True):
                self.cache[key] = (np.asarray(s, np.float64), np.asarray(a, np.float64))
            self.computed += len(chunk)
        return [self.cache[key] for key, _, _ in requests]


def calibrate_sizes(
    evidence: Evidence, items: Sequence[EvalItem], sizes: Sequence[int], tag: str, seed: int = 0
) -> dict[int, Calibration]:
    """One calibration per N from the same examples (the service's ``n`` calibration)."""
    examples = [(it.query, [open_image(im) for im in it.images], it.answer) for it in items]
    plan = multi_n_instances(examples, sizes, seed)
    out = {}
    for n, (instances, gt) in plan.items():
        keyed = [(("calibration", tag, n, r), q, ims) for r, (q, ims) in enumerate(instances)]
        got = evidence.get(keyed)
        out[n] = estimate_calibration(
            np.stack([g[0] for g in got]), np.stack([g[1] for g in got]), gt
        )
    return out


def play(
    evidence: Evidence,
    item: EvalItem,
    images: list[Any],
    method: str,
    window: int,
    calibrations: dict[int, Calibration],
    config: MethodConfig,
    seed: int,
    top_n: int = 1,
    rule: str = "auto",
) -> tuple[list[int], int]:
    """One item's tournament under ``method``: (full ranking, forward passes spent)."""
    t = Tournament(len(images), window, top_n, seed, rule)
    spent = 0
    while (windows := t.next_round()) is not None:
        requests, shape = [], []
        for w in windows:
            k = passes(method, len(w))
            for r in range(k):
                order = [w[(i + r) % len(w)] for i in range(len(w))]
                requests.append(((item.id, *order), item.query, [images[i] for i in order]))
            shape.append(k)
        got, at, probabilities = evidence.get(requests), 0, []
        for w, k in zip(windows, shape, strict=True):
            mine, at = got[at : at + k], at + k
            out = apply_method(
                method,
                mine[0][0],
                mine[0][1],
                calibrations.get(len(w)),
                config,
                rotated_scores=[g[0] for g in mine],
            )
            probabilities.append(out.probabilities)
        spent += len(requests)
        t.record(probabilities)
    return t.ranking(), spent


def calibrated(
    runner: Any, dataset: Any, args: argparse.Namespace
) -> tuple[Evidence, dict[int, Calibration], frozenset[str]]:
    """The evidence cache, the profiles of every window size (one ``n: "all"`` calibration
    on M examples of W candidates) and the calibration items' keys (never evaluated)."""
    evidence = Evidence(runner, args.batch_size)
    calibration_items = dataset.items(
        args.calibration, args.window, "random", args.calibration_seed
    )
    calibrations = calibrate_sizes(evidence, calibration_items, range(2, args.window + 1), "all")
    return evidence, calibrations, frozenset(i.key for i in calibration_items)


def paired(a: np.ndarray, b: np.ndarray, indices: np.ndarray) -> dict[str, Any]:
    """The mean per-item difference a − b with its item-bootstrap CI and a verdict."""
    d = a - b
    ci = mean_ci(d, indices)
    return {
        "mean": float(d.mean()),
        "ci": ci,
        "verdict": "inside noise" if ci[0] <= 0 <= ci[1] else "CI excludes 0",
    }


def with_ci(x: dict[str, Any], digits: int = 1) -> str:
    """``mean [lo, hi]`` of a summary."""
    return f"{x['mean']:.{digits}f} [{x['ci'][0]:.{digits}f}, {x['ci'][1]:.{digits}f}]"
