"""The cost curves of a ``lad bench curves`` record as one figure (matplotlib, Agg backend).

Top row latency (median ms, the range over rounds shaded), bottom row peak memory (MiB above
the level before the call), one column per axis (N, tokens per image, batch size), one line
per method. Drawn from the record alone, so a record from another machine (the GPU run of
scripts/gpu_bench.sh) draws the same way.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

AXIS_LABELS = {"n": "N (candidates)", "tokens": "tokens per image", "batch": "batch size"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def series(record: dict[str, Any]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The record's cells by axis, then method, in x order (the tokens axis by tokens)."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for cell in record["cells"]:
        out.setdefault(cell["axis"], {}).setdefault(cell["method"], []).append(cell)
    for methods in out.values():
        for cells in methods.values():
            cells.sort(key=lambda c: _x(c))
    return out


def _x(cell: dict[str, Any]) -> float:
    return cell["tokens_per_image"] if cell["axis"] == "tokens" else cell["x"]


def draw(record: dict[str, Any], path: str | Path) -> Path:
    """Write the figure to ``path`` (PNG) and return it; a record without cells is refused."""
    by_axis = series(record)
    if not by_axis:
        raise ValueError("the record has no cells to draw")
    plt = _pyplot()
    axes_names = [a for a in AXIS_LABELS if a in by_axis]
    fig, grid = plt.subplots(
        2, len(axes_names), figsize=(4.2 * len(axes_names), 6.4), squeeze=False
    )
    window = record.get("window")
    for col, axis in enumerate(axes_names):
        top, bottom = grid[0][col], grid[1][col]
        for method, cells in by_axis[axis].items():
            xs = [_x(c) for c in cells]
            (line,) = top.plot(xs, [c["median_ms"] for c in cells], marker="o", label=method)
            low, high = [c["min_ms"] for c in cells], [c["max_ms"] for c in cells]
            top.fill_between(xs, low, high, color=line.get_color(), alpha=0.15)
            bottom.plot(xs, [c["peak_mib"] for c in cells], marker="o", label=method)
        if axis == "n" and window:
            for ax in (top, bottom):
                ax.axvline(window, color="grey", linestyle=":", linewidth=1)
            top.annotate("rerank beyond", (window, 0.95), xycoords=("data", "axes fraction"),
                         fontsize=7, color="grey", ha="left")  # fmt: skip
        top.set_yscale("log")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({_x(c) for cells in by_axis[axis].values() for c in cells}))
            ax.xaxis.set_major_formatter("{x:g}")
        top.set_ylabel("latency, ms (median, range)")
        bottom.set_ylabel("peak memory, MiB")
        bottom.set_xlabel(AXIS_LABELS[axis])
        top.set_title(AXIS_LABELS[axis], fontsize=10)
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
    grid[0][0].legend(fontsize=8)
    fig.suptitle(
        f"{record.get('model')} on {record.get('device')}, {record.get('dtype')}", fontsize=10
    )
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="redraw a curves record's figure")
    parser.add_argument("record", help="bench/results/curves_<model>.json")
    parser.add_argument("out", help="the PNG to write")
    args = parser.parse_args(argv)
    print(draw(json.loads(Path(args.record).read_text()), args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
