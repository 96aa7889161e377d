"""``lad eval --stream`` on the demo model, a small slice: the outputs, the windows, and the
replay's invariants (no accuracy of the current weights is assumed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from app.method.calibrate import CalibrationStats, estimate_from_stats
from app.method.methods import MethodConfig
from lad_lab.eval import cli
from lad_lab.eval.stream import StreamSetup, _agd, replay

pytestmark = pytest.mark.slow


def test_stream_writes_windows_events_and_the_gap(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    out = tmp_path / "stream"
    argv = [
        "--stream",
        "--model",
        "demo",
        "-n",
        "3",
        "--items",
        "90",
        "--window",
        "30",
        "--feedback-rate",
        "0.6",
        "--refresh-every",
        "10",
        "--min-row-count",
        "3",
        "--min-holdout",
        "2",
        "--drift-prompt-variant",
        "instruction",
        "--bootstrap",
        "200",
        "--quiet",
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 0
    result = json.loads((out / "stream.json").read_text())
    assert [w["requests"] for w in result["windows"]] == [[1, 30], [31, 60], [61, 90]]
    for w in result["windows"]:
        for m in ("vanilla", "drifted", "online", "right"):
            assert w[m]["ci"][0] <= w[m]["acc"] <= w[m]["ci"][1]
    fb = [e["feedback"] for e in result["events"]]
    assert fb == [10 * (i + 1) for i in range(len(fb))] and len(fb) >= 3
    s = result["summary"]
    assert s["tail_requests"] == 30 and s["gap_ci"][0] <= s["gap_points"] <= s["gap_ci"][1]
    assert (out / "stream.png").stat().st_size > 1000
    assert "--stream" in (out / "stream.md").read_text()


def test_replay_serves_the_drifted_profile_until_a_refresh_goes_live() -> None:
    rng = np.random.default_rng(0)
    r, n, layers = 400, 3, 2
    gt = rng.integers(0, n, size=r)
    scores = rng.normal(size=(r, n))
    scores[np.arange(r), gt] += 1.0
    attention = rng.random(size=(r, layers, n)) + 0.1
    attention[np.arange(r), :, gt] += 0.5
    drifted = CalibrationStats.from_evidence(
        rng.normal(size=(6, n)) * 3, rng.random(size=(6, layers, n)), np.arange(6) % n
    )
    config = MethodConfig()
    setup = StreamSetup(feedback_rate=0.5, refresh_every=20, min_row_count=5, min_holdout=3)
    online, events = replay(scores, attention, gt, drifted, config, setup, n)
    static = _agd(estimate_from_stats(drifted), scores, attention, config)
    first = next((e["request"] for e in events if e["live"]), r)
    np.testing.assert_array_equal(online[:first], static[:first])
    assert all(e["held_out"] >= 0 for e in events) and events
