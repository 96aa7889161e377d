"""`lad bench soak` and `lad bench memory` run end to end on the demo model (short runs)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_soak_reports_minutes_errors_and_memory(tmp_path):
    from app.bench.soak import main

    out = tmp_path / "soak.json"
    assert main(["--minutes", "0.15", "--concurrency", "2", "--calibrate-every-s", "3",
                 "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["errors"] == 0 and record["requests"] > 0
    assert record["calibrations"] >= 1
    row = record["rows"][0]
    assert row["p99_ms"] >= row["p50_ms"] > 0 and row["rss_mib"] > 0
    assert record["rss_start_mib"] > 0 and "rss_growth_pct" in record


def test_memory_bench_reports_peak_and_held_memory(tmp_path):
    from app.bench.memory import main

    out = tmp_path / "memory.json"
    assert main(["--side", "1024", "--settle-s", "0.5", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [(r["format"], r["concurrent"]) for r in record["rows"]] == [
        ("PNG", 1), ("PNG", 4), ("JPEG", 1), ("JPEG", 4)]
    for row in record["rows"]:
        assert set(row["statuses"]) == {200}
        assert row["peak_above_idle_mib"] < 1024  # the 4 x 12 images decode within bounds
