"""`lad bench soak`, `lad bench memory` and `lad bench hardening` run end to end on the demo
model (short runs)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_soak_reports_minutes_errors_and_memory(tmp_path):
    from lad_lab.bench.soak import main

    out = tmp_path / "soak.json"
    assert (
        main(
            [
                "--minutes",
                "0.15",
                "--concurrency",
                "2",
                "--calibrate-every-s",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    record = json.loads(out.read_text())
    assert record["errors"] == 0 and record["requests"] > 0
    assert record["calibrations"] >= 1
    row = record["rows"][0]
    assert row["p99_ms"] >= row["p50_ms"] > 0 and row["rss_mib"] > 0
    assert record["rss_start_mib"] > 0 and "rss_growth_pct" in record


def test_memory_bench_reports_peak_and_held_memory(tmp_path):
    from lad_lab.bench.memory import main

    out = tmp_path / "memory.json"
    assert main(["--side", "1024", "--settle-s", "0.5", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [(r["format"], r["concurrent"]) for r in record["rows"]] == [
        ("PNG", 1),
        ("PNG", 4),
        ("JPEG", 1),
        ("JPEG", 4),
    ]
    for row in record["rows"]:
        assert set(row["statuses"]) == {200}
        assert row["peak_above_idle_mib"] < 1024  # the 4 x 12 images decode within bounds


def test_hardening_bench_answers_every_hostile_class_with_a_4xx(tmp_path):
    from lad_lab.bench.hardening import main

    out = tmp_path / "hardening.json"
    assert (
        main(["--segments", "20000", "--keys", "50000", "--settle-s", "0.2", "--out", str(out)])
        == 0
    )
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    assert len(rows) == 12  # issue 19's seven classes and issue 29's five (round 3)
    served = ("warn", "retrieve:", "storm:")  # within every bound: answered, not refused
    for name, row in rows.items():
        expected = {200} if any(s in name for s in served) else {400, 405, 413, 422}
        assert set(row["statuses"]) <= expected, (name, row)
        assert row["peak_above_idle_mib"] < 512 and row.get("log_bytes", 0) < 20_000, (name, row)
    beside = [r for r in rows.values() if "normal_request" in r]
    assert beside and all(r["normal_request"] == 200 for r in beside)
