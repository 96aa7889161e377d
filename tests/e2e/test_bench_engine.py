"""`lad bench engine` runs end to end on a tiny model and writes a complete JSON record."""

import json

import pytest

from app.cli import main


@pytest.mark.slow
def test_bench_engine_writes_every_variant(tmp_path, capsys):
    out = tmp_path / "engine.json"
    code = main(["bench", "engine", "--model", "tiny-qwen2_5_vl", "--tokens", "300",
                 "--n", "2", "--reps", "2", "--threads", "1", "--out", str(out)])  # fmt: skip
    assert code == 0
    record = json.loads(out.read_text())
    cells = record["cells"]
    assert {c["variant"] for c in cells} == {"sdpa", "agd", "eager"}
    for cell in cells:
        assert cell["n"] == 2
        assert 250 <= cell["prompt_tokens"] <= 360
        assert cell["median_ms"] > 0
        assert cell["peak_mib"] >= 0
    assert "(b)/(a)" in capsys.readouterr().out
