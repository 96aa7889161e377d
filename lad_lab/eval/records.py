"""The prediction record: one (item, ordering, method, n, setting) of predictions.jsonl.

Keys (the interface of issue 8; users and tests rely on them):

    item                 the item's id (dataset-specific, stable for a seed)
    n, setting, dataset  the run
    ordering             index of the ordering among the item's T orderings
    order                the permutation: order[p] = the item's original candidate at position p
    images               file names in the order shown (file-based datasets only)
    method               vanilla, pride, attn_raw, attn_pure, agd, perm_avg, instruction, cot,
                         self_consistency
    gt_position          0-based position of the matching image in this ordering
    predicted_position   0-based; None when a generated answer could not be parsed
    correct              predicted_position == gt_position
    probabilities        N floats summing to 1 (generation: the vote shares)
    forward_passes       model calls for this instance (perm_avg N; generation: tokens x samples)
    latency_ms           its share of the batched wall-clock time
    generation           True for the generation-based baselines (cot, self_consistency)
    samples, unparseable generation only: answers sampled, answers that could not be parsed
    answers, text        generation only: parsed positions per sample, the first sample's text

``Group`` turns the records of one (n, setting) back into (item, ordering) arrays.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

TEXT_CHARS = 300
"""Generated text kept per record (the first sample, truncated)."""


def run_key(n: int, setting: str) -> str:
    """The key of one (n, setting) run in calibration.json and in file names."""
    return f"{setting}_n{n}"


def make_record(
    *,
    item: str,
    n: int,
    setting: str,
    dataset: str,
    ordering: int,
    order: Sequence[int],
    method: str,
    gt_position: int,
    probabilities: Sequence[float],
    predicted_position: int | None,
    forward_passes: int,
    latency_ms: float,
    generation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One JSON-ready record; ``generation`` adds samples / unparseable / answers / text."""
    record: dict[str, Any] = {
        "item": item,
        "n": int(n),
        "setting": setting,
        "dataset": dataset,
        "ordering": int(ordering),
        "order": [int(x) for x in order],
        "method": method,
        "gt_position": int(gt_position),
        "predicted_position": None if predicted_position is None else int(predicted_position),
        "correct": predicted_position is not None and int(predicted_position) == int(gt_position),
        "probabilities": [float(x) for x in probabilities],
        "forward_passes": int(forward_passes),
        "latency_ms": float(latency_ms),
        "generation": generation is not None,
    }
    if generation is not None:
        record.update(
            samples=len(generation["answers"]),
            unparseable=sum(a is None for a in generation["answers"]),
            answers=list(generation["answers"]),
            text=generation["text"][:TEXT_CHARS],
        )
    return record


def write_records(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    with path.open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Group:
    """The records of one (n, setting), as (item, ordering) arrays per method."""

    def __init__(self, n: int, setting: str, records: Sequence[Mapping[str, Any]]) -> None:
        self.n, self.setting = n, setting
        self.items = list(dict.fromkeys(r["item"] for r in records))
        self.orderings = sorted({int(r["ordering"]) for r in records})
        self.methods = list(dict.fromkeys(r["method"] for r in records))
        index = {item: i for i, item in enumerate(self.items)}
        slot = {o: t for t, o in enumerate(self.orderings)}
        shape = (len(self.items), len(self.orderings))
        self.by_method: dict[str, dict[str, np.ndarray]] = {}
        for method in self.methods:
            mine = [r for r in records if r["method"] == method]
            if len(mine) != shape[0] * shape[1]:
                raise ValueError(
                    f"method {method!r} at N={n} {setting} has {len(mine)} records, expected "
                    f"{shape[0]} items x {shape[1]} orderings"
                )
            arrays = {
                "correct": np.zeros(shape, bool),
                "gt": np.zeros(shape, np.int64),
                "pred": np.full(shape, -1, np.int64),
                "image": np.full(shape, -1, np.int64),
                "prob": np.zeros((*shape, n)),
                "passes": np.zeros(shape),
                "ms": np.zeros(shape),
                "unparseable": np.zeros(shape),
                "samples": np.zeros(shape),
            }
            for r in mine:
                i, t = index[r["item"]], slot[int(r["ordering"])]
                arrays["correct"][i, t] = bool(r["correct"])
                arrays["gt"][i, t] = int(r["gt_position"])
                pred = r["predicted_position"]
                if pred is not None:
                    arrays["pred"][i, t] = int(pred)
                    arrays["image"][i, t] = int(r["order"][int(pred)])
                arrays["prob"][i, t] = r["probabilities"]
                arrays["passes"][i, t] = float(r["forward_passes"])
                arrays["ms"][i, t] = float(r["latency_ms"])
                arrays["unparseable"][i, t] = float(r.get("unparseable", 0))
                arrays["samples"][i, t] = float(r.get("samples", 1))
            arrays["generation"] = np.array(bool(mine[0].get("generation", False)))
            self.by_method[method] = arrays

    @property
    def gt(self) -> np.ndarray:
        return next(iter(self.by_method.values()))["gt"]

    def position_counts(self) -> list[int]:
        return np.bincount(self.gt.ravel(), minlength=self.n).astype(int).tolist()
