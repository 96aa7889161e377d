"""``lad bench curves``: the points it measures, the tournament's forwards per method, and
the figure and table drawn from a record alone."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import numpy as np
import pytest

from lad_lab.bench.curves import METHODS, Methods, points, render
from lad_lab.bench.curves_plot import draw, series


def _record() -> dict:
    cells = []
    for axis, xs in {"n": [2, 4, 24], "tokens": [224, 56, 112], "batch": [1, 4]}.items():
        for x in xs:
            for k, method in enumerate(METHODS):
                ms = float(x * (k + 1))
                cells.append(
                    {"axis": axis, "x": x, "method": method, "median_ms": ms,
                     "min_ms": ms * 0.9, "max_ms": ms * 1.2, "peak_mib": x / 4 + k,
                     "prompt_tokens": 100 + x, "tokens_per_image": (x // 28) ** 2 + 2}
                )  # fmt: skip
    return {"model": "tiny", "device": "cpu", "dtype": "float32", "window": 12, "cells": cells}


def test_the_figure_is_drawn_from_a_record(tmp_path) -> None:
    import matplotlib.image

    out = draw(_record(), tmp_path / "images" / "cost.png")
    pixels = matplotlib.image.imread(out)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 900  # two rows, three columns
    assert pixels[..., :3].std() > 0.05  # lines drawn, not a blank canvas
    with pytest.raises(ValueError, match="no cells"):
        draw({"cells": []}, tmp_path / "empty.png")


def test_the_series_are_per_axis_and_method_in_x_order() -> None:
    by = series(_record())
    assert set(by) == {"n", "tokens", "batch"} and set(by["n"]) == set(METHODS)
    assert [c["x"] for c in by["tokens"]["agd"]] == [56, 112, 224]  # by tokens per image
    assert [c["x"] for c in by["n"]["perm_avg"]] == [2, 4, 24]


def test_the_table_has_one_row_per_point_with_each_methods_range() -> None:
    table = render(_record()).splitlines()
    assert len(table) == 2 + 3 + 3 + 2
    assert "| tokens/image | 6 |" in table[5]  # 56-pixel sides: 4 tokens + 2 delimiters
    assert "| N | 24 | 124 | 24 (22–29) | 48 (43–58) | 72 (65–86) |" in table[4]


def test_the_axes_vary_one_setting_around_the_base_request() -> None:
    args = argparse.Namespace(n="2,64", sides="56", batch="1,8", base_n=4, side=112)
    got = [(p["axis"], p["n"], p["side"], p["batch"]) for p in points(args)]
    assert got == [
        ("n", 2, 112, 1), ("n", 64, 112, 1), ("tokens", 4, 56, 1),
        ("batch", 4, 112, 1), ("batch", 4, 112, 8),
    ]  # fmt: skip


class _Runner:
    """Scores favouring the first image; counts the rows of each forward."""

    layers = (0,)

    def __init__(self) -> None:
        self.rows: list[int] = []

    def forward(self, items):
        self.rows.append(len(items))
        return SimpleNamespace(scores=[-np.arange(len(i.images), dtype=float) for i in items])


def test_beyond_the_window_a_tournament_batches_windows_or_one_windows_orderings() -> None:
    runner = _Runner()
    methods = Methods(runner, window=4, max_batch=3)
    methods.request("vanilla", list(range(16)))
    vanilla = list(runner.rows)
    assert max(vanilla) <= 3 and sum(vanilla) >= 4  # up to 3 windows a forward
    runner.rows.clear()
    methods.request("perm_avg", list(range(16)))
    assert set(runner.rows) <= {4, 2, 3} and len(runner.rows) == sum(vanilla)  # a window's N
    assert methods.forwards == len(vanilla) + len(runner.rows)
