"""`lad bench peer --no-peer --threads` runs end to end on the demo model (tiny counts)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_peer_bench_compares_thread_settings_without_a_peer(tmp_path):
    from lad_lab.bench.peer import main

    out = tmp_path / "threads.json"
    argv = ["--no-peer", "--threads", "auto,1", "--concurrency", "1,4", "--requests", "4"]
    argv += ["--rounds", "2", "--cache", str(tmp_path / "models"), "--out", str(out)]
    assert main(argv) == 0
    assert not (tmp_path / "models").exists()  # the demo as shipped: nothing copied
    record = json.loads(out.read_text())
    assert record["reference"] == "lad agd threads=1"
    assert {s["name"] for s in record["sides"]} == {"lad agd threads=auto", "lad agd threads=1"}
    assert all(s["startup_s"] > 0 and s["peak_rss_mib"] > 100 for s in record["sides"])
    assert all(s["engine"]["dtype"] == "float32" for s in record["sides"])  # the demo's own
    cells = record["cells"]
    assert len(cells) == 2 * 2 * 2  # streams x levels x sides
    assert all(c["requests"] == 4 and c["errors"] == 0 for c in cells)
    assert all(c["ratio"]["min"] > 0 for c in cells if c["side"].endswith("auto"))
    assert "| lad agd threads=1 |" in record["table"]
