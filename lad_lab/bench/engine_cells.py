"""One measured cell of ``lad bench engine`` and the table docs/benchmarks.md shows of them."""

from __future__ import annotations

from dataclasses import dataclass

VARIANTS = ("sdpa", "agd", "eager")


@dataclass
class Cell:
    """One measured (variant, target tokens, N) combination."""

    variant: str
    target_tokens: int
    n: int
    prompt_tokens: int
    image_side: int
    median_ms: float
    p90_ms: float
    peak_mib: float | None  # None: not measured (--no-memory)
    reps: int
    # median over rounds of (this variant's time / sdpa's time in the same round): on a
    # shared machine the load drifts between rounds, much less within one
    paired_ratio_to_sdpa: float | None = None
    # the paired median of each repeat (a fresh process each): its spread is the result's
    repeat_ratios: list[float] | None = None


def _ms(cell: Cell | None) -> str:
    return f"{cell.median_ms:.1f}" if cell else "–"


def _mib(cell: Cell | None) -> str:
    return f"{cell.peak_mib:.1f}" if cell and cell.peak_mib is not None else "–"


def spread(cell: Cell) -> str:
    """The paired median's range over repeats (fresh processes), or – for a single run."""
    runs = cell.repeat_ratios or []
    return f"{min(runs):.3f}–{max(runs):.3f} ({len(runs)})" if len(runs) > 1 else "–"


def render(cells: list[Cell]) -> str:
    by = {(c.variant, c.target_tokens, c.n): c for c in cells}
    lines = [
        "| tokens | N | (a) sdpa ms | (b) agd ms | (c) eager ms | (b)/(a) paired "
        "| (b)/(a) range over runs | (c)/(b) | peak (a) MiB | peak (b) MiB | peak (c) MiB |",
        "|" + "---|" * 11,
    ]
    for tokens, n in sorted({(c.target_tokens, c.n) for c in cells}):
        a, b, c = (by.get((v, tokens, n)) for v in VARIANTS)
        assert a is not None and b is not None  # sdpa and agd are always measured
        ratio = b.paired_ratio_to_sdpa or b.median_ms / a.median_ms
        eager = f"{c.median_ms / b.median_ms:.2f}" if c else "–"
        lines.append(
            f"| {b.prompt_tokens} | {n} | {_ms(a)} | {_ms(b)} | {_ms(c)} | {ratio:.3f} | "
            f"{spread(b)} | {eager} | {_mib(a)} | {_mib(b)} | {_mib(c)} |"
        )
    return "\n".join(lines)
