"""The report's figures, drawn from metrics.json alone (matplotlib, Agg backend).

Per (n, setting): the GT position x predicted position heatmap of every method (% of each
row; the paper's figure 1) and the recall by GT position of every method. Per setting with
several N: accuracy vs N with the item-bootstrap 95% CIs (the paper's figure 5).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

from lad_lab.eval.records import run_key


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def confusion_figure(run: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    methods = list(run["methods"])
    cols = min(3, len(methods))
    rows = math.ceil(len(methods) / cols)
    n = run["n"]
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 3.0 * rows), squeeze=False)
    for ax in axes.ravel()[len(methods) :]:
        ax.axis("off")
    for ax, method in zip(axes.ravel(), methods, strict=False):
        m = run["methods"][method]
        ax.imshow(m["confusion"], vmin=0, vmax=100, cmap="Blues")
        ax.set_title(f"{method}: {m['acc']:.1f}%", fontsize=9)
        ax.set_xticks(range(n), [str(j + 1) for j in range(n)], fontsize=7)
        ax.set_yticks(range(n), [str(t + 1) for t in range(n)], fontsize=7)
        ax.set_xlabel("predicted position", fontsize=7)
        ax.set_ylabel("GT position", fontsize=7)
        if n <= 8:
            for t, row in enumerate(m["confusion"]):
                for j, value in enumerate(row):
                    ax.text(
                        j,
                        t,
                        f"{value:.0f}",
                        ha="center",
                        va="center",
                        fontsize=6,
                        color="white" if value > 60 else "black",
                    )
    fig.suptitle(f"GT x predicted position (% of row), N={n}, {run['setting']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def recall_figure(run: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    methods = list(run["methods"])
    n = run["n"]
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * n + 3), 3.4))
    for k, method in enumerate(methods):
        m = run["methods"][method]
        recall = [r if r is not None else 0.0 for r in m["recall_by_position"]]
        cis = m.get("recall_ci") or [None] * n
        err = [
            [r - ci[0] if ci else 0.0 for r, ci in zip(recall, cis, strict=True)],
            [ci[1] - r if ci else 0.0 for r, ci in zip(recall, cis, strict=True)],
        ]
        ax.bar(
            [j + (k - (len(methods) - 1) / 2) * width for j in range(n)],
            recall,
            width,
            yerr=err,
            capsize=2,
            error_kw={"elinewidth": 0.8},
            label=method,
        )
    ax.axhline(100.0 / n, color="k", linestyle=":", linewidth=1, label=f"chance (1/{n})")
    ax.set_xticks(range(n), [str(j + 1) for j in range(n)])
    ax.set_xlabel("GT position")
    ax.set_ylabel("recall (%)")
    ax.set_ylim(0, 100)
    ax.set_title(
        f"Recall by GT position, N={n}, {run['setting']} (95% item-bootstrap CI)", fontsize=9
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def accuracy_vs_n_figure(runs: list[dict[str, Any]], setting: str, path: Path) -> None:
    plt = _pyplot()
    runs = sorted(runs, key=lambda r: r["n"])
    methods = list(dict.fromkeys(m for r in runs for m in r["methods"]))
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    ns = sorted({r["n"] for r in runs})
    step = 0.2 * min((b - a for a, b in itertools.pairwise(ns)), default=1) / len(methods)
    for k, method in enumerate(methods):
        points = [(r["n"], r["methods"][method]) for r in runs if method in r["methods"]]
        dodge = (k - (len(methods) - 1) / 2) * step  # error bars of one N side by side
        xs = [x + dodge for x, _ in points]
        ys = [m["acc"] for _, m in points]
        err = [
            [m["acc"] - m["acc_ci"][0] for _, m in points],
            [m["acc_ci"][1] - m["acc"] for _, m in points],
        ]
        ax.errorbar(xs, ys, yerr=err, marker="o", markersize=3, capsize=2, label=method)
    ax.plot(ns, [100.0 / x for x in ns], "k:", label="chance (1/N)")
    ax.set_xlabel("N (candidate images)")
    ax.set_ylabel("accuracy (%)")
    ax.set_xticks(sorted({r["n"] for r in runs}))
    ax.set_title(f"Accuracy vs N, {setting} (95% item-bootstrap CI)", fontsize=9)
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside the data
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_plots(metrics: dict[str, Any], out: Path) -> dict[str, dict[str, str]]:
    """Every figure into ``out``; returns file names by run key (and by setting for acc vs N)."""
    figures: dict[str, dict[str, str]] = {}
    for run in metrics["runs"]:
        key = run_key(run["n"], run["setting"])
        names = {"confusion": f"confusion_{key}.png", "recall": f"recall_{key}.png"}
        confusion_figure(run, out / names["confusion"])
        recall_figure(run, out / names["recall"])
        figures[key] = names
    for setting in dict.fromkeys(r["setting"] for r in metrics["runs"]):
        mine = [r for r in metrics["runs"] if r["setting"] == setting]
        if len({r["n"] for r in mine}) > 1:
            name = f"accuracy_vs_n_{setting}.png"
            accuracy_vs_n_figure(mine, setting, out / name)
            figures.setdefault("accuracy_vs_n", {})[setting] = name
    return figures
