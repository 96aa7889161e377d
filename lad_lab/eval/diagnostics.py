"""Diagnostics of one (n, setting) run: which signal is informative where, how agd and
attn_pure differ, how large κ̂ is against the scores, and the attention prior per layer.

- ROC-AUC per position of "this position holds the match", from the logits (vanilla's
  probabilities, i.e. exp s), the raw attention evidence (attn_raw's share ā_k / Σ ā) and the
  posterior π (attn_pure); 0.5 = no information at that position.
- agd vs attn_pure: rescues (agd right where attn_pure is wrong), harms, agreement.
- κ̂ (calibration) against the spread of the vanilla scores s on the evaluation items.
- The attention prior P^(l) per layer of Λ with the sink flag of DESIGN §2.4.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from app.method import debias
from app.method.calibrate import estimate_calibration
from lad_lab.eval import stats
from lad_lab.eval.records import Group

EVIDENCE = {"logits": "vanilla", "attention": "attn_raw", "posterior": "attn_pure"}
"""Which method's probabilities stand for which signal in the ROC-AUC table."""


def position_auc(prob: np.ndarray, gt: np.ndarray) -> list[float | None]:
    """ROC-AUC per position k over all instances: evidence prob[..., k], positive iff GT = k."""
    n = prob.shape[-1]
    flat, g = prob.reshape(-1, n), gt.ravel()
    return [stats.roc_auc(flat[:, k], g == k) for k in range(n)]


def _score_spread(prob: np.ndarray) -> dict[str, float]:
    """Within-instance spread of s = log p (vanilla): mean range and mean std over instances."""
    s = np.log(np.clip(prob.reshape(-1, prob.shape[-1]), 1e-300, None))
    return {
        "mean_range": float(np.mean(s.max(axis=1) - s.min(axis=1))),
        "mean_std": float(np.mean(s.std(axis=1))),
    }


def diagnostics(group: Group, calibration: Mapping[str, Any] | None) -> dict[str, Any]:
    """The diagnostics block of one run (entries only where their methods ran)."""
    by = group.by_method
    out: dict[str, Any] = {
        "roc_auc": {
            signal: position_auc(by[method]["prob"], by[method]["gt"])
            for signal, method in EVIDENCE.items()
            if method in by
        }
    }
    if "agd" in by and "attn_pure" in by:
        agd, pure = by["agd"], by["attn_pure"]
        out["agd_vs_attn_pure"] = {
            "rescues": int((agd["correct"] & ~pure["correct"]).sum()),
            "harms": int((~agd["correct"] & pure["correct"]).sum()),
            "both_right": int((agd["correct"] & pure["correct"]).sum()),
            "both_wrong": int((~agd["correct"] & ~pure["correct"]).sum()),
            "agreement_pct": float(100.0 * np.mean(agd["pred"] == pure["pred"])),
        }
    if "vanilla" in by:
        spread = _score_spread(by["vanilla"]["prob"])
        kappa = None if calibration is None else calibration_block(calibration)["kappa"]
        out["kappa_vs_scores"] = {
            "kappa": kappa,
            "score_range": spread["mean_range"],
            "score_std": spread["mean_std"],
            "kappa_over_range": None
            if kappa is None or spread["mean_range"] == 0
            else kappa / spread["mean_range"],
        }
    return out


def calibration_block(calibration: Mapping[str, Any]) -> dict[str, Any]:
    """B, κ̂ and P per layer (sink layers flagged) re-estimated from calibration.json's evidence
    with the engine's own estimator."""
    scores = np.asarray(calibration["scores"], dtype=float)
    attention = np.asarray(calibration["attention"], dtype=float)
    estimated = estimate_calibration(scores, attention, np.asarray(calibration["gt_positions"]))
    prior = estimated.attention_prior
    flags = debias.sink_layers(prior)
    layers = [int(x) for x in calibration["layers"]]
    b = estimated.bias_matrix
    return {
        "dataset": calibration.get("dataset"),
        "setting": calibration.get("setting"),
        "items": list(calibration.get("items", [])),
        "kappa": float(estimated.kappa or 0.0),
        "bias_matrix": b.tolist(),
        "bias_row_range": float(np.mean(b.max(axis=1) - b.min(axis=1))),
        "attention_prior": [
            {"layer": layer, "prior": row.tolist(), "min": float(row.min()), "sink": bool(flag)}
            for layer, row, flag in zip(layers, prior, flags, strict=True)
        ],
        "sink_threshold": debias.SINK_THRESHOLD,
        "sink_layers": [layer for layer, flag in zip(layers, flags, strict=True) if flag],
        "sink_guard": bool(calibration.get("sink_guard", True)),
    }
