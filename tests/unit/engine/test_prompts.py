"""The paper's prompt (DESIGN §2.6), byte-exact, and its hash; the CoT baselines' prompt."""

from __future__ import annotations

import pytest

from app.engine.labels import (
    DEFAULT_COT_PROMPT,
    PROMPT_VARIANTS,
    cot_prompt_text,
    prompt_hash,
    prompt_text,
    resolve_labels,
)
from app.engine.runner import RetrievalItem
from lad_lab.testing.tiny_models import random_images

VANILLA_N4 = (
    "Given 4 images indexed from 1 to 4, identify the image that best matches the provided "
    "caption. Respond with the index number only and nothing else.\n"
    "Caption: a dog on a red sofa\n"
    "Answer: "
)


def test_vanilla_digits_is_byte_exact() -> None:
    text = prompt_text("a dog on a red sofa", resolve_labels("digits", 4))
    assert text == VANILLA_N4
    assert text.endswith("Answer: ")


def test_instruction_inserts_fairness_sentence_before_respond() -> None:
    text = prompt_text("a dog on a red sofa", resolve_labels("digits", 4), "instruction")
    head, _, tail = text.partition("provided caption. ")
    assert head == "Given 4 images indexed from 1 to 4, identify the image that best matches the "
    assert tail.startswith(
        "Please note that the provided images have been randomly shuffled, so it is essential "
        "to consider them fairly and without bias. Analyze the visual content objectively and "
        "do not be influenced by the order of the images. Respond with the index number only"
    )
    assert text.replace(tail[: tail.index("Respond")], "") == VANILLA_N4


def test_other_schemes_use_first_and_last_label() -> None:
    text = prompt_text("q", resolve_labels("upper", 5))
    assert text.startswith("Given 5 images labeled from A to E, identify")
    assert "Respond with the label only and nothing else.\n" in text
    assert prompt_text("q", resolve_labels("digits", 12)).startswith(
        "Given 12 images indexed from 1 to 12,"
    )


def test_prompt_hash_is_stable_and_separates_variants_and_templates() -> None:
    hashes = {prompt_hash(v, "template-a") for v in PROMPT_VARIANTS}
    assert len(hashes) == len(PROMPT_VARIANTS)
    assert prompt_hash("vanilla", "template-a") == prompt_hash("vanilla", "template-a")
    assert prompt_hash("vanilla", "template-a") != prompt_hash("vanilla", "template-b")
    assert len(prompt_hash("vanilla", "")) == 64
    with pytest.raises(ValueError, match="variant"):
        prompt_text("q", ["1", "2"], "cot-free")


def test_rendered_chat_prompt_puts_images_first(shared_runner) -> None:
    runner = shared_runner("qwen2_5_vl")
    (prompt,) = runner.prompts([RetrievalItem("a dog on a red sofa", random_images(4))])
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    assert prompt.endswith(f"{image * 4}{VANILLA_N4}<|im_end|>\n<|im_start|>assistant\n")


DIGITS = ["1", "2", "3", "4"]


def test_cot_prompt_text() -> None:
    text = cot_prompt_text("a red star", DIGITS)
    assert text.startswith("Given 4 images indexed from 1 to 4, identify the image")
    assert text.endswith("Caption: a red star\nAnswer: ")
    for label in DIGITS[1:]:  # names no label position (the range phrase says "1 to 4")
        assert label not in text.replace("Given 4 images indexed from 1 to 4", "")
    custom = cot_prompt_text("q", ["A", "B"], "{n} {range} {first}-{last}: {query}")
    assert custom == "2 labeled from A to B A-B: q"
    assert "{query}" in DEFAULT_COT_PROMPT
