"""`lad bench connections` runs end to end on a real `lad serve` (small counts)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_connections_bench_reports_every_class_and_ordinary_requests_get_through(tmp_path):
    from lad_lab.bench.connections import main

    out = tmp_path / "connections.json"
    assert (
        main(
            [
                "--idle",
                "40",
                "--over-cap",
                "60",
                "--max-connections",
                "30",
                "--disconnects",
                "5",
                "--heads",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    for name in ("idle_sockets", "idle_sockets_past_the_cap", "slow_bodies"):
        assert rows[name]["ordinary_statuses"] == {"200": 30}, name
    assert rows["idle_sockets_past_the_cap"]["held_closed_by_server"] >= 30
    assert rows["disconnect_mid_body"]["counted_499"] == 5
    assert rows["disconnect_mid_body"]["counted_5xx"] == 0
    smuggle = rows["content_length_and_transfer_encoding"]
    assert (smuggle["status"], smuggle["answers"], smuggle["closed"]) == (400, 1, True)
    assert smuggle["smuggled_ran"] == 0 and smuggle["json_envelope"]
    assert rows["head_100kb"]["status"] == 431 and rows["heads_200kb_concurrent"]["all_closed"]
