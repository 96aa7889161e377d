"""The paper's retrieval prompt (DESIGN §2.6), byte-exact, and its hash for the fingerprint.

The text part follows the N images. For digit labels and N = 4 the vanilla text
is three lines: the first, one long line, reads "Given 4 images indexed from 1
to 4, identify the image that best matches the provided caption. Respond with
the index number only and nothing else."; then "Caption: {query}"; then
"Answer: " (one trailing space, no newline). See ``TEMPLATE``.

Other label schemes swap the range phrase and the answer noun via
``labels.label_phrases`` ("labeled from A to D", "the label"). The
"instruction" variant inserts the fairness instruction before "Respond ...".

The ``cot`` and ``self_consistency`` baselines (§2.5) ask for reasoning first and a final
"The answer is <label>" (``cot_prompt_text``); the wording is a setting
(``LAD_COT_PROMPT``), and ``DEFAULT_COT_PROMPT`` names no label position.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from app.engine.labels import label_phrases

PROMPT_VARIANTS: tuple[str, ...] = ("vanilla", "instruction")

# {range}: "indexed from 1 to N" (digits) / "labeled from A to D"; {noun}: "the index number"
TEMPLATE = (
    "Given {n} images {range}, identify the image that best matches the provided caption. "
    "{instruction}Respond with {noun} only and nothing else.\n"
    "Caption: {query}\n"
    "Answer: "
)

FAIRNESS_INSTRUCTION = (
    "Please note that the provided images have been randomly shuffled, so it is essential "
    "to consider them fairly and without bias. Analyze the visual content objectively and "
    "do not be influenced by the order of the images. "
)


DEFAULT_COT_PROMPT = (
    "Given {n} images {range}, identify the image that best matches the provided caption. "
    'Think step by step first, then end with the sentence "The answer is" followed by '
    "{noun} of the matching image.\n"
    "Caption: {query}\n"
    "Answer: "
)
"""The CoT / self-consistency text part (the N images come first, as in §2.6). It names no
label: an example answer such as "The answer is 4" would prime the last position."""


def _check_variant(variant: str) -> None:
    if variant not in PROMPT_VARIANTS:
        raise ValueError(f"unknown prompt variant {variant!r}; use one of {PROMPT_VARIANTS}")


def _filled(template: str, query: str, labels: Sequence[str], instruction: str = "") -> str:
    """A template with N, the scheme's range phrase and noun, the first and last label, the
    query and the instruction filled in (a template uses the fields it names)."""
    labels = list(labels)
    range_phrase, noun = label_phrases(labels)
    return template.format(
        n=len(labels),
        range=range_phrase,
        noun=noun,
        first=labels[0],
        last=labels[-1],
        instruction=instruction,
        query=query,
    )


def prompt_text(query: str, labels: Sequence[str], variant: str = "vanilla") -> str:
    """The text part of the prompt for N = len(labels) images."""
    _check_variant(variant)
    return _filled(
        TEMPLATE, query, labels, FAIRNESS_INSTRUCTION if variant == "instruction" else ""
    )


def prompt_hash(variant: str, chat_template: str) -> str:
    """sha256 over the template text, the variant and the chat template (profile fingerprint)."""
    _check_variant(variant)
    digest = hashlib.sha256()
    for part in (
        TEMPLATE,
        FAIRNESS_INSTRUCTION if variant == "instruction" else "",
        variant,
        chat_template,
    ):
        digest.update(part.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


def cot_prompt_text(query: str, labels: Sequence[str], template: str = DEFAULT_COT_PROMPT) -> str:
    """The text part of a CoT prompt for N = len(labels) images."""
    return _filled(template, query, labels)
