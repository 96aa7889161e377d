"""Text and Markdown renderings of evaluation results (the model card's and the CLI's tables)."""

from __future__ import annotations

from collections.abc import Sequence

from app.eval.metrics import MethodResult

FORMATS = ("markdown", "text")


def _rows(results: Sequence[MethodResult]) -> list[list[str]]:
    return [
        [
            r.method,
            f"{r.accuracy_mean:.1f} ± {r.accuracy_std:.1f}",
            f"{r.rstd:.1f}",
            f"{r.consistency:.1f}",
        ]
        for r in results
    ]


def _render(header: list[str], rows: list[list[str]], fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {FORMATS}")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        padded = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |" if fmt == "markdown" else "  ".join(padded)

    if fmt == "markdown":
        rule = (
            "|"
            + "|".join(
                "-" * (w + 1) + ":" if i else ":" + "-" * (w + 1) for i, w in enumerate(widths)
            )
            + "|"
        )
    else:
        rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def results_table(results: Sequence[MethodResult], fmt: str = "markdown") -> str:
    """One row per method: Acc (mean ± std over orderings), RStd and Cons, all in %."""
    header = ["method", "Acc (%)", "RStd", "Cons (%)"]
    return _render(header, _rows(results), fmt)


def confusion_table(result: MethodResult, fmt: str = "markdown") -> str:
    """The GT position x predicted position selection rates (%) of one method."""
    n = result.n
    header = ["GT \\ pred", *(str(j + 1) for j in range(n)), "recall"]
    rows = [
        [
            str(t + 1),
            *(f"{x:.1f}" for x in result.confusion[t]),
            "-"
            if result.recall_per_position[t] is None
            else f"{result.recall_per_position[t]:.1f}",
        ]
        for t in range(n)
    ]
    return _render(header, rows, fmt)
