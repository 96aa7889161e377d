"""``lad eval --stream``: a dataset replayed as traffic, with feedback on a fraction of it.

The question (DESIGN §2.8): a profile calibrated on the wrong setting or prompt variant
(a *drifted* start) serves the traffic; feedback arrives on ``--feedback-rate`` of the
requests; every ``--refresh-every`` new feedback the refresh of the service
(``app.method.refresh``: the same blend, minimum row count and held-out guard) runs on the
same online store backend (``calibration_store.evidence``). How much of the gap between
the drifted profile and one calibrated offline on the right setting does it close?

Each request is one forward pass (one random ordering of one item, so the GT sits at every
position equally often in expectation); every method is then answered from the same
scores and attention, so the drifted, the right and the online profile are compared on
exactly the same requests (paired). Accuracy is reported per window of requests with a
95% bootstrap CI, and the recovered share of the gap over the last third of the stream
with a paired bootstrap CI.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.method.calibrate import Calibration, CalibrationStats, calibration_instances
from app.method.methods import MethodConfig, apply_method
from app.method.refresh import online_stats, refresh_calibration
from calibration_store import Evidence, ProfileKey
from calibration_store.evidence import HOLDOUT_BUCKETS, MemoryOnlineStore
from lad_lab.eval.datasets import EvalItem
from lad_lab.eval.evidence import Options, forward
from lad_lab.eval.protocol import apply_ordering
from lad_lab.eval.stats import LEVEL, percentile_ci

STATIC = ("vanilla", "drifted", "right")


@dataclass(frozen=True)
class StreamSetup:
    """The knobs of one streaming run (``lad eval --stream`` flags)."""

    feedback_rate: float = 0.3
    window: int = 100
    refresh_every: int = 50
    min_row_count: int = 20
    min_holdout: int = 20
    seed: int = 0
    bootstrap: int = 2000
    prior: str = "feedback"


def offline_stats(runner: Any, items: list[EvalItem], options: Options) -> CalibrationStats:
    """DESIGN §2.3 on ``items`` (all N rotations), as sums and counts."""
    instances, gt = calibration_instances([(i.query, i.images, i.answer) for i in items])
    scores, attention, _ = forward(runner, instances, options, lambda _: None)
    return CalibrationStats.from_evidence(scores, attention, gt)


def traffic(
    items: list[EvalItem], n: int, seed: int
) -> tuple[list[tuple[str, list[Any]]], np.ndarray]:
    """One seeded random ordering per item: the requests and where their GT sits."""
    rng = np.random.default_rng(seed)
    requests, gt = [], []
    for item in items:
        perm = rng.permutation(n)
        requests.append((item.query, apply_ordering(item.images, perm)))
        gt.append(int(np.flatnonzero(perm == item.answer)[0]))
    return requests, np.asarray(gt)


def replay_held_out(request_id: str) -> bool:
    """The replay's held-out split: a hash of its own request ids, 1 in HOLDOUT_BUCKETS, so a
    replay reproduces (the service draws at random instead: no client may choose it)."""
    return hashlib.sha256(request_id.encode()).digest()[0] % HOLDOUT_BUCKETS == 0


def _agd(cal: Calibration, s: np.ndarray, a: np.ndarray, config: MethodConfig) -> np.ndarray:
    return np.argmax(apply_method("agd", s, a, cal, config).probabilities, axis=-1)


def replay(
    scores: np.ndarray,
    attention: np.ndarray,
    gt: np.ndarray,
    drifted: CalibrationStats,
    config: MethodConfig,
    setup: StreamSetup,
    n: int,
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """The online profile through the stream: predictions (R,) and the refresh decisions."""
    from app.method.calibrate import estimate_from_stats

    store = MemoryOnlineStore(ttl_s=1e9, max_entries=len(gt) + 1)
    key = ProfileKey(model_id="stream", name="stream", label_scheme="digits", n=n)
    live = estimate_from_stats(drifted)
    rng = np.random.default_rng(setup.seed + 1)
    predictions = np.empty(len(gt), dtype=np.int64)
    events: list[dict[str, Any]] = []
    since = 0
    for r in range(len(gt)):
        predictions[r] = _agd(live, scores[r], attention[r], config)
        rid = f"req-{r}"
        held = replay_held_out(rid)
        store.put_evidence(rid, Evidence.of(key, 1, scores[r], attention[r], held))  # as served
        if rng.random() >= setup.feedback_rate:
            continue
        store.feedback(rid, int(gt[r]), True)
        since += 1
        if since < setup.refresh_every:
            continue
        since = 0
        snap = store.snapshot(key, attention.shape[1])
        feedback = online_stats(snap, setup.prior)
        out = refresh_calibration(
            live,
            drifted,
            feedback,
            snap.holdout,
            config,
            min_row_count=setup.min_row_count,
            min_holdout=setup.min_holdout,
        )
        if out.live:
            live = out.calibration
        events.append(
            {
                "request": r + 1,
                "feedback": snap.count,
                "live": out.live,
                "reason": out.reason,
                "held_out": out.held_out,
                "accuracy_live": out.accuracy_live,
                "accuracy_refreshed": out.accuracy_refreshed,
            }
        )
    return predictions, events


def _ci(hits: np.ndarray, samples: int, rng: np.random.Generator) -> list[float]:
    idx = rng.integers(0, len(hits), size=(samples, len(hits)))
    return [round(100 * x, 1) for x in percentile_ci(hits[idx].mean(axis=1))]


def summarise(correct: dict[str, np.ndarray], setup: StreamSetup) -> dict[str, Any]:
    """Accuracy per window with CIs, and the recovered share of the gap (last third)."""
    rng = np.random.default_rng(setup.seed + 2)
    total = len(next(iter(correct.values())))
    windows = []
    for start in range(0, total - setup.window + 1, setup.window):
        rows = slice(start, start + setup.window)
        windows.append(
            {
                "requests": [start + 1, start + setup.window],
                **{
                    m: {"acc": round(100 * float(c[rows].mean()), 1), "ci": _ci(c[rows], 500, rng)}
                    for m, c in correct.items()
                },
            }
        )
    tail = slice(total - total // 3, total)
    d, r, o = (correct[m][tail].astype(float) for m in ("drifted", "right", "online"))
    idx = rng.integers(0, len(d), size=(setup.bootstrap, len(d)))
    gap, got = (r[idx] - d[idx]).mean(axis=1), (o[idx] - d[idx]).mean(axis=1)
    gap_point = float(r.mean() - d.mean())
    share = np.where(np.abs(gap) > 1e-12, got / np.where(np.abs(gap) > 1e-12, gap, 1), np.nan)
    summary = {
        "tail_requests": len(d),
        "acc": {m: round(100 * float(correct[m][tail].mean()), 1) for m in correct},
        "gap_points": round(100 * gap_point, 1),
        "gap_ci": [round(100 * x, 1) for x in percentile_ci(gap)],
        "recovered_points": round(100 * float(o.mean() - d.mean()), 1),
        "recovered_ci": [round(100 * x, 1) for x in percentile_ci(got)],
        "recovered_share": None
        if abs(gap_point) < 1e-12
        else round(float((o.mean() - d.mean()) / gap_point), 3),
        "recovered_share_ci": [round(float(x), 3) for x in percentile_ci(share[np.isfinite(share)])]
        if np.isfinite(share).any()
        else None,
        "level": LEVEL,
    }
    return {"windows": windows, "summary": summary}


def write_outputs(result: dict[str, Any], out: Path) -> None:
    """stream.json, stream.md (table) and stream.png (accuracy per window)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "stream.json").write_text(json.dumps(result, indent=1) + "\n")
    methods = [m for m in ("vanilla", "drifted", "online", "right") if m in result["windows"][0]]
    lines = [
        "# Streaming evaluation: online calibration from a drifted start",
        "",
        "Produced by:",
        "",
        f"    {result['command']}",
        "",
        result["description"],
        "",
        "| requests | " + " | ".join(f"{m} acc % [95% CI]" for m in methods) + " |",
        "|:--|" + "--:|" * len(methods),
    ]
    for w in result["windows"]:
        cells = [f"{w[m]['acc']:.1f} [{w[m]['ci'][0]:.1f}, {w[m]['ci'][1]:.1f}]" for m in methods]
        lines.append(f"| {w['requests'][0]}-{w['requests'][1]} | " + " | ".join(cells) + " |")
    s = result["summary"]
    lines += [
        "",
        f"Last third of the stream ({s['tail_requests']} requests): accuracy "
        + ", ".join(f"{m} {v:.1f}" for m, v in s["acc"].items())
        + ".",
        f"Gap right − drifted: {s['gap_points']:+.1f} points {s['gap_ci']}; online − "
        f"drifted: {s['recovered_points']:+.1f} points {s['recovered_ci']}; recovered "
        f"share {s['recovered_share']} (paired bootstrap 95% CI "
        f"{s['recovered_share_ci']}).",
        "",
        "Refresh decisions (every refresh_every feedback):",
        "",
        "| after request | feedback | live | held-out | reason |",
        "|--:|--:|:--|--:|:--|",
    ]
    for e in result["events"]:
        lines.append(
            f"| {e['request']} | {e['feedback']} | {e['live']} | {e['held_out']} | {e['reason']} |"
        )
    (out / "stream.md").write_text("\n".join(lines) + "\n")
    _plot(result, methods, out / "stream.png")


def _plot(result: dict[str, Any], methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    x = [np.mean(w["requests"]) for w in result["windows"]]
    for m in methods:
        acc = [w[m]["acc"] for w in result["windows"]]
        lo = [w[m]["ci"][0] for w in result["windows"]]
        hi = [w[m]["ci"][1] for w in result["windows"]]
        ax.plot(x, acc, marker="o", label=m)
        ax.fill_between(x, lo, hi, alpha=0.15)
    for e in result["events"]:
        if e["live"]:
            ax.axvline(e["request"], color="grey", alpha=0.3, lw=0.8)
    ax.set_xlabel("request (window centre); grey: a refresh went live")
    ax.set_ylabel("accuracy % (95% CI)")
    ax.set_title(result["title"])
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_stream(
    runner: Any, config: Any, setup: StreamSetup, *, drift_runner: Any = None
) -> dict[str, Any]:
    """The whole streaming run on a loaded runner; ``config`` is the EvalConfig of the
    flags (dataset, N, settings, seeds, M, method knobs). ``drift_runner``: the runner the
    drifted profile is calibrated with (another prompt variant), else ``runner``."""
    from lad_lab.eval.harness import _datasets, _default_seeds

    started = time.perf_counter()
    eval_seed, calibration_seed = _default_seeds(config.dataset, config.benchmark_name())
    eval_seed = config.eval_seed if config.eval_seed is not None else eval_seed
    calibration_seed = (
        config.calibration_seed if config.calibration_seed is not None else calibration_seed
    )
    main, other = _datasets(runner, config)
    n = config.ns[0]
    setting = (config.settings or [main.settings[0]])[0]
    drift_setting = config.calibration_setting or setting
    options = Options(
        labels=config.labels, batch_size=config.batch_size, config=config.method_config()
    )
    items = main.items(config.items, n, setting, eval_seed)
    exclude = frozenset(i.key for i in items)
    right_items = other.items(config.calibration, n, setting, calibration_seed, exclude=exclude)
    drift_items = other.items(
        config.calibration, n, drift_setting, calibration_seed, exclude=exclude
    )
    right = offline_stats(runner, right_items, options)
    drifted = offline_stats(drift_runner or runner, drift_items, options)
    requests, gt = traffic(items, n, config.ordering_seed)
    scores, attention, _ = forward(runner, requests, options, lambda _: None)
    mc = config.method_config()
    from app.method.calibrate import estimate_from_stats

    online, events = replay(scores, attention, gt, drifted, mc, setup, n)
    correct = {
        "vanilla": np.argmax(scores, axis=1) == gt,
        "drifted": _agd(estimate_from_stats(drifted), scores, attention, mc) == gt,
        "right": _agd(estimate_from_stats(right), scores, attention, mc) == gt,
        "online": online == gt,
    }
    result = summarise(correct, setup)
    drift_what = (
        f"prompt variant {drift_runner.prompt_variant!r}"
        if drift_runner is not None
        else f"setting {drift_setting!r}"
    )
    result.update(
        command=config.command,
        events=events,
        title=f"N={n} {setting}: agd from a profile calibrated on {drift_what}",
        description=(
            f"Model `{config.model}`, dataset `{config.dataset}` {setting}, N = {n}, "
            f"{len(gt)} requests (one seeded random ordering per item, seed "
            f"{config.ordering_seed}). drifted: agd with a profile calibrated (M = "
            f"{config.calibration}) on {drift_what}; right: agd with a profile calibrated "
            f"(M = {config.calibration}) on the served setting and prompt; online: agd "
            f"starting from the drifted profile, refreshed (blend of its offline sums with "
            f"feedback, rows trusted from {setup.min_row_count} feedback, held-out guard with "
            f"at least {setup.min_holdout} held-out) every {setup.refresh_every} feedback, "
            f"feedback on {setup.feedback_rate:.0%} of requests (seed {setup.seed}), 1 in 5 "
            f"of them held out; the refreshed prior from the {setup.prior} requests. Windows of "
            f"{setup.window} requests; CIs: request bootstrap within the window."
        ),
        setup=setup.__dict__,
        n=n,
        setting=setting,
        drift=drift_what,
        wall_s=round(time.perf_counter() - started, 1),
    )
    write_outputs(result, config.out)
    return result
