"""docs/benchmarks.md's tables come from the JSON records (``python -m tools.docs bench``), and the
service bench's per-stage arithmetic adds up."""

from __future__ import annotations

import json
import re

import pytest

from lad_lab.bench.service_details import (
    FIXED_STAGES,
    SERVER_STAGES,
    server_timing_ms,
    stage_breakdown,
)
from tools.docs import bench_tables as tables


def _cell(variant: str, n: int, ms: float, mib: float) -> dict:
    return {
        "variant": variant,
        "target_tokens": 1500,
        "n": n,
        "prompt_tokens": 1400 + n,
        "image_side": 56,
        "median_ms": ms,
        "p90_ms": ms,
        "peak_mib": mib,
        "reps": 3,
    }


def test_rewrite_fills_blocks_between_markers_and_leaves_the_rest() -> None:
    text = (
        f"intro\n{tables._start('engine')}\nold table\n{tables._end('engine')}\n"
        f"middle\n{tables._start('gpu')}\nkept\n{tables._end('gpu')}\nend\n"
    )
    out, missing = tables.rewrite(text, {"engine": "NEW", "gpu": None, "service": "S"})
    assert "old table" not in out and f"{tables._start('engine')}\nNEW\n" in out
    assert "kept" in out and out.startswith("intro\n") and out.endswith("end\n")
    assert missing == ["gpu", "service"]  # no record / no markers: left as it is
    assert tables.rewrite(out, {"engine": "NEW"})[0] == out  # idempotent


def test_scale_block_reports_agd_over_vanilla_per_n(tmp_path) -> None:
    cells = [
        _cell("sdpa", 2, 10.0, 5.0),
        _cell("agd", 2, 10.5, 5.5),
        _cell("eager", 2, 30, 50),
        _cell("sdpa", 8, 20.0, 9.0),
        _cell("agd", 8, 20.2, 9.1),
        _cell("eager", 8, 90, 99),
    ]
    record = {"command": "lad bench engine --n 2,8", "model": "demo", "cells": cells}
    (tmp_path / "scale_n_demo.json").write_text(json.dumps(record))
    block = tables.blocks(tmp_path)["scale-n"]
    assert "| demo | 2 | 1402 | 10.0 | 10.5 | 1.050 | 5.0 | 5.5 | 1.100 |" in block
    assert "| demo | 8 | 1408 | 20.0 | 20.2 | 1.010 | 9.0 | 9.1 | 1.011 |" in block
    assert "`lad bench engine --n 2,8`" in block


def test_committed_records_render_every_block() -> None:
    generated = tables.blocks()
    assert generated["engine"] and generated["service"]  # the committed records exist
    assert "(b)/(a)" in generated["engine"]


def test_server_timing_header_is_read() -> None:
    assert server_timing_ms("app;dur=12.5") == 12.5
    assert server_timing_ms('db;dur=3, app;desc="x";dur=7') == 7.0
    assert server_timing_ms(None) is None and server_timing_ms("db;dur=3") is None


def test_stage_breakdown_splits_the_service_time() -> None:
    timings = {
        "decode": 3.0,
        "base64": 0.5,
        "queue": 1.0,
        "process": 2.0,
        "forward": 10.0,
        "score": 0.5,
        "debias": 0.25,
        "encode": 0.25,
    }
    stages = stage_breakdown([(20.0, 18.0, timings), (22.0, 19.0, timings)])
    assert stages["image_decode"] == pytest.approx(2.5)  # decode includes base64
    server = sum(stages[s] for s in SERVER_STAGES)
    assert server == pytest.approx(17.0)
    assert stages["http_json"] == pytest.approx(18.5 - 17.0)  # service time minus stages
    assert stages["client"] == pytest.approx(2.5)  # client latency minus service time
    assert stages["fixed"] == pytest.approx(sum(stages[s] for s in FIXED_STAGES))
    assert stages["fixed"] == pytest.approx(1.5 + 0.5 + 2.5 + 2.0 + 0.25)
    older = stage_breakdown([(20.0, None, timings)])  # no Server-Timing: client latency
    assert older["http_json"] == pytest.approx(3.0) and older["client"] == 0.0


def test_benchmarks_page_is_current() -> None:
    assert tables.main(["--check"]) == 0, "run `python -m tools.docs bench --write`"


def test_figures_in_prose_are_filled_from_the_records(tmp_path) -> None:
    from tools.docs import figures

    cells = [_cell("sdpa", 4, 10.0, 5.0), _cell("agd", 4, 10.3, 5.5), _cell("agd", 12, 9.9, 5)]
    cells[1]["repeat_ratios"] = [0.98, 1.04]
    (tmp_path / "a.json").write_text(json.dumps({"cells": cells, "summary": {"x": 1.637}}))
    (tmp_path / "b.json").write_text(json.dumps({"cells": [_cell("agd", 4, 20.0, 1.0)]}))

    def fig(record: str, path: str, spec: str, shown: str = "stale") -> str:
        return f"<!-- fig {record} {path} {spec} -->{shown}<!-- /fig -->"

    text = " ".join(
        [
            fig("a.json", "summary.x", ".2f"),
            fig("a.json", "cells[variant=agd,n=4].repeat_ratios", "range.2f"),
            fig("a.json", "cells[variant=agd,n=4].median_ms/cells[variant=sdpa].median_ms", ".3f"),
            fig("*.json", "cells[variant=agd].median_ms", "range.1f"),
            fig("a.json", "cells[variant=agd].median_ms", "max.0f"),
            fig("a.json", "cells[variant=agd].median_ms", "mean.2f"),
            fig("a.json", "cells[variant=agd].median_ms", "ci95.1f"),
            fig("a.json", "cells[variant=agd].median_ms", "count"),
        ]
    )
    out, problems = figures.fill(text, tmp_path)
    assert problems == []
    shown = re.findall(r"-->([^<]*)<!-- /fig", out)
    # the mean of 10.3 and 9.9; its bootstrap interval spans the two rounds
    assert shown == ["1.64", "0.98–1.04", "1.030", "9.9–20.0", "10", "10.10", "9.9–10.3", "2"]
    assert figures.fill(out, tmp_path) == (out, [])  # idempotent
    broken = fig("a.json", "cells[variant=agd].median_ms", ".1f") + fig("c.json", "x", ".1f")
    out, problems = figures.fill(broken, tmp_path)
    assert out == broken and len(problems) == 2  # two values for one figure; no record
    assert "use range" in problems[0] and "no record" in problems[1]


def test_the_benchmarks_prose_states_no_ratio_by_hand() -> None:
    """A three-decimal ratio in the page's prose is a figure of a record: generated, never
    typed (the 1.034 / 0.932 that stayed under a table saying 1.023 / 0.967)."""
    from tools.docs import figures

    prose = figures.prose(tables.PAGE.read_text())
    typed = re.findall(r"(?<![\d.])(?<!fastapi )[01]\.\d{3}(?![\d.])", prose)
    assert typed == [], typed
    assert prose.count("\n") > 100 and tables.PAGE.read_text().count("<!-- fig ") >= 40
