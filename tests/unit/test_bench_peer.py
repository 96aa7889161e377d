"""``lad bench peer``'s pure parts: the per-round ratio and its spread, the answers'
agreement, the repeated stream, the peer's request and answer, and the record's table."""

from __future__ import annotations

import math
from pathlib import Path

from lad_lab.bench import peer
from lad_lab.bench.peer_server import chat_body, context_length, peer_answer


def test_ratio_spread_is_the_median_and_range_of_per_round_ratios() -> None:
    spread = peer.ratio_spread([2.0, 3.0, 4.0], [2.0, 2.0, 2.0])
    assert spread == {"median": 1.5, "min": 1.0, "max": 2.0}
    assert math.isnan(peer.ratio_spread([0.0], [1.0])["median"])  # a round with no answers


def test_agreement_counts_only_requests_both_answered() -> None:
    ours = {0: 1, 1: 2, 2: 0, 3: None}
    theirs = {0: 1, 1: 3, 3: 0, 4: 1}
    assert peer.agreement(ours, theirs) == {"requests": 2, "agree": 1}


def test_repeated_stream_rotates_images_and_moves_the_answer() -> None:
    pool = [{"query": "q", "images": ["a", "b", "c", "d"], "answer": 2}]
    stream = peer.repeated_stream(pool, 3)
    assert [s["images"][s["answer"]] for s in stream] == ["c", "c", "c"]
    assert stream[1]["images"] == ["b", "c", "d", "a"]


def test_reference_is_the_peer_else_one_thread() -> None:
    def side(name: str, kind: str = "lad", threads: str | None = None) -> peer.Side:
        return peer.Side(name, kind, "http://x", None, 1.0, threads=threads)

    assert peer.reference_side([side("a", threads="1"), side("vllm", "vllm")]) == "vllm"
    assert peer.reference_side([side("a", threads="auto"), side("b", threads="1")]) == "b"


def test_peer_request_asks_the_same_prompt_for_one_label_token() -> None:
    body = chat_body({"query": "a red circle", "images": ["u1", "u2"]}, "m", ["1", "2"], [16, 17])
    content = body["messages"][0]["content"]
    assert [c["type"] for c in content] == ["image_url", "image_url", "text"]
    assert "Caption: a red circle" in content[-1]["text"]
    assert body["allowed_token_ids"] == [16, 17] and body["max_tokens"] == 1
    assert body["temperature"] == 0 and body["logprobs"] is True
    assert peer_answer({"choices": [{"message": {"content": "2"}}]}, ["1", "2"]) == 1
    assert peer_answer({"choices": [{"message": {"content": "x"}}]}, ["1", "2"]) is None


def test_record_table_has_ratios_startup_memory_and_agreement() -> None:
    cell = peer.summarise("distinct", 4, "lad agd", [peer.Chunk(2.0, [10.0, 30.0], {}, 0)])
    assert cell.requests_per_s == 1.0 and cell.p50_ms == 20.0
    cell.ratio = {"median": 1.2, "min": 1.1, "max": 1.3}
    record = {
        "reference": "vllm",
        "cells": [vars(cell)],
        "sides": [vars(peer.Side("lad agd", "lad", "u", 1, 6.5, peak_rss_mib=440.0))],
        "agreement": {"requests": 64, "agree": 62},
    }
    table = peer.render(record)
    assert "| distinct | 4 | lad agd | 1.00 | 20 | 29 | 1.20 (1.10-1.30) |" in table
    assert "| lad agd | 6.5 | 440 |" in table
    assert "62 of 64" in table


def test_context_length_is_capped_by_the_checkpoints_own(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"text_config": {"max_position_embeddings": 1024}}')
    assert context_length(tmp_path) == 1024  # the demo's: vLLM refuses a longer one
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 128000}')
    assert context_length(tmp_path) == 2048
