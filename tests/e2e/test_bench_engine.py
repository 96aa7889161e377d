"""`lad bench engine` runs end to end on a tiny model and writes a complete JSON record."""

import json

import pytest

from app.cli import main


@pytest.mark.slow
def test_bench_engine_writes_every_variant(tmp_path, capsys):
    out = tmp_path / "engine.json"
    code = main(
        [
            "bench",
            "engine",
            "--model",
            "tiny-qwen2_5_vl",
            "--tokens",
            "300",
            "--n",
            "2",
            "--reps",
            "2",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )
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


@pytest.mark.slow
def test_bench_attention_holds_capture_to_eager_in_both_dtypes(tmp_path, capsys):
    out = tmp_path / "attention.json"
    code = main(
        [
            "bench",
            "attention",
            "--models",
            "tiny-qwen2_5_vl",
            "--dtypes",
            "float32,bfloat16",
            "--side",
            "112",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    checks = json.loads(out.read_text())["checks"]
    assert [(c["model"], c["dtype"]) for c in checks] == [
        ("tiny-qwen2_5_vl", "float32"),
        ("tiny-qwen2_5_vl", "bfloat16"),
    ]
    for check in checks:
        assert check["ok"] and 0 <= check["max_abs_diff"] <= check["atol"]
        assert 0 < check["captured_mass_mean"] <= 1.0 + 1e-3
    assert "max |captured - eager|" in capsys.readouterr().out


def test_bench_attention_refuses_cuda_without_a_gpu(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = main(["bench", "attention", "--device", "cuda", "--out", str(tmp_path / "a.json")])
    assert code == 2
    assert "CUDA is not available" in capsys.readouterr().err
    assert not (tmp_path / "a.json").exists()


@pytest.mark.slow
def test_bench_engine_on_a_real_shape_names_lambda_and_the_spread(tmp_path):
    out = tmp_path / "shape.json"
    code = main(
        [
            "bench",
            "engine",
            "--model",
            "shape:qwen2_5_vl-3b",
            "--width",
            "128",
            "--tokens",
            "120",
            "--n",
            "2",
            "--reps",
            "1",
            "--repeats",
            "2",
            "--variants",
            "sdpa,agd",
            "--no-memory",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    record = json.loads(out.read_text())
    assert record["layers"] == list(range(21, 36)) and record["width"] == 128
    agd = next(c for c in record["cells"] if c["variant"] == "agd")
    assert len(agd["repeat_ratios"]) == 2 and agd["peak_mib"] is None
    assert "range over runs" in record["table"]


@pytest.mark.slow
def test_bench_engine_batch_writes_throughput_and_perm_avg(tmp_path, capsys):
    out = tmp_path / "batch.json"
    code = main(
        [
            "bench",
            "engine",
            "--model",
            "tiny-qwen2_5_vl",
            "--tokens",
            "300",
            "--n",
            "3",
            "--reps",
            "1",
            "--threads",
            "1",
            "--batch",
            "1,2",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    record = json.loads(out.read_text())
    assert record["complete"] and record["cells"] == []
    assert [b["batch"] for b in record["batches"]] == [1, 2]
    for row in record["batches"]:
        assert row["median_ms"] > 0 and row["requests_per_s"] > 0 and row["n"] == 3
    (perm,) = record["perm_avg"]
    assert perm["n"] == 3 and perm["median_ms"] > 0 and perm["paired_ratio_to_agd"] > 0
    assert "perm_avg / agd" in capsys.readouterr().out
