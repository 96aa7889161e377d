"""The text the model is asked: the candidate labels c_0..c_{N-1} and the prompt that names
them (DESIGN §2.1, §2.6).

Labels: "1".."N", letters, roman numerals, number words or a custom list; a stable scheme
name for the profile fingerprint; the prompt phrases that depend on the scheme; and the
parsing of a labels value sent as text (a form field or a query parameter).

The prompt: the paper's retrieval prompt, byte-exact, and its hash for the fingerprint. The
text part follows the N images. For digit labels and N = 4 the vanilla text is three lines:
the first, one long line, reads "Given 4 images indexed from 1 to 4, identify the image that
best matches the provided caption. Respond with the index number only and nothing else.";
then "Caption: {query}"; then "Answer: " (one trailing space, no newline). See
``TEMPLATE``. Other label schemes swap the range phrase and the answer noun
(``label_phrases``: "labeled from A to D", "the label"). The "instruction" variant inserts
the fairness instruction before "Respond ...". The ``cot`` and ``self_consistency``
baselines (§2.5) ask for reasoning first and a final "The answer is <label>"
(``cot_prompt_text``); the wording is the evaluation's (``lad eval``), and
``DEFAULT_COT_PROMPT`` names no label position.

Torch-free on purpose: the wire path validates labels before anything touches the model.
Scoring the labels with the model's logits is ``app.engine.label_scoring``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lad_client.vocabulary import SCHEMES

LabelSpec = str | tuple[str, ...]
"""A scheme name or an explicit tuple of N labels (hashable: it keys caches and batches)."""

_LIST_PATTERN = r"^\[.*\]$|^[^,]+(,[^,]+)+$"
SCHEME_PATTERN = "^(" + "|".join(SCHEMES) + ")$"
"""A scheme name (rerank: its windows vary in N, so no explicit list)."""
TEXT_PATTERN = "^(" + "|".join(SCHEMES) + r")$|" + _LIST_PATTERN
"""A labels value sent as text (a form field): a scheme name, a JSON list or a comma list."""
STORED_TEXT_PATTERN = "^(" + "|".join(SCHEMES) + r"|custom:[0-9a-f]{8})$|" + _LIST_PATTERN
"""A labels value naming a stored profile (a query parameter): the text forms, or a stored
``custom:<hash>`` as the profile routes list it. These patterns only shape the OpenAPI
document and refuse garbage early; :func:`parse_labels` and :func:`resolve_labels` decide."""

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_ROMAN = (
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
)


def _roman(k: int) -> str:
    out = []
    for value, symbol in _ROMAN:
        count, k = divmod(k, value)
        out.append(symbol * count)
    return "".join(out)


def _words(k: int) -> str:
    if k < 20:
        return _ONES[k]
    if k < 100:
        tens, ones = divmod(k, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    hundreds, rest = divmod(k, 100)
    return f"{_ONES[hundreds]} hundred" + (f" {_words(rest)}" if rest else "")


_SCHEME_LIMITS = {"digits": None, "upper": 26, "lower": 26, "roman": 3999, "words": 999}


def _scheme_labels(name: str, n: int) -> list[str]:
    limit = _SCHEME_LIMITS[name]
    if limit is not None and n > limit:
        raise ValueError(f"label scheme {name!r} supports at most {limit} labels, got N={n}")
    if name == "digits":
        return [str(k) for k in range(1, n + 1)]
    if name == "upper":
        return [chr(ord("A") + k) for k in range(n)]
    if name == "lower":
        return [chr(ord("a") + k) for k in range(n)]
    if name == "roman":
        return [_roman(k) for k in range(1, n + 1)]
    return [_words(k) for k in range(1, n + 1)]


def resolve_labels(spec: str | Sequence[str], n: int) -> list[str]:
    """The N label strings c_0..c_{N-1} of a scheme name or an explicit custom list."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of images N must be a positive int, got {n!r}")
    if isinstance(spec, str):
        if spec not in SCHEMES:
            raise ValueError(f"unknown label scheme {spec!r}; use one of {SCHEMES} or a list")
        return _scheme_labels(spec, n)
    labels = list(spec)
    if len(labels) != n:
        raise ValueError(f"custom label list has {len(labels)} labels but N={n}")
    if not all(isinstance(c, str) and c.strip() for c in labels):
        raise ValueError("custom labels must be non-empty strings")
    if len(set(labels)) != n:
        raise ValueError(f"custom labels must be distinct, got {labels}")
    return labels


def scheme_name(spec: str | Sequence[str]) -> str:
    """Stable scheme name for the profile fingerprint.

    A custom list that equals a named scheme gets that name (same prompt, same
    profile); any other list is ``custom:<first 8 hex of sha1 of its JSON>``.
    """
    if isinstance(spec, str):
        if spec not in SCHEMES:
            raise ValueError(f"unknown label scheme {spec!r}; use one of {SCHEMES} or a list")
        return spec
    return _named(resolve_labels(spec, len(list(spec))))


def _named(labels: list[str]) -> str:
    """The scheme name of resolved labels (a named scheme's, else ``custom:<hash>``)."""
    for name in SCHEMES:
        limit = _SCHEME_LIMITS[name]
        if (limit is None or len(labels) <= limit) and labels == _scheme_labels(name, len(labels)):
            return name
    digest = hashlib.sha1(json.dumps(labels, ensure_ascii=False).encode("utf-8")).hexdigest()
    return f"custom:{digest[:8]}"


def label_phrases(labels: Sequence[str]) -> tuple[str, str]:
    """(range phrase, answer noun) for the §2.6 prompt.

    Digit labels keep the paper's byte-exact wording ("indexed from 1 to N",
    "the index number"); other schemes say "labeled from <first> to <last>" and
    "the label".
    """
    labels = list(labels)
    if not labels:
        raise ValueError("need at least one label")
    if labels == _scheme_labels("digits", len(labels)):
        return f"indexed from 1 to {len(labels)}", "the index number"
    return f"labeled from {labels[0]} to {labels[-1]}", "the label"


def label_spec(labels: str | Sequence[str]) -> LabelSpec:
    """The hashable form of a labels value: a scheme name as is, a list as a tuple."""
    return labels if isinstance(labels, str) else tuple(labels)


def parse_labels(text: str) -> LabelSpec:
    """A labels value sent as text: a JSON list, a comma list, or a scheme name.

    Also accepts a stored scheme name ``custom:<hash>`` (what the profile routes list).
    Raises ValueError for a malformed JSON list or an unknown name.
    """
    value = text.strip()
    if value.startswith("["):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError("labels is not a valid JSON list") from None
        if not isinstance(parsed, list) or not all(isinstance(x, str) for x in parsed):
            raise ValueError("labels must be a JSON list of strings")
        return tuple(parsed)
    if "," in value:
        return tuple(part.strip() for part in value.split(","))
    if value in SCHEMES or value.startswith("custom:"):
        return value
    raise ValueError(f"unknown label scheme {text!r}; use one of {SCHEMES} or a list")


def stored_scheme(labels: LabelSpec) -> str:
    """The scheme name a profile is stored under for ``labels`` (``custom:<hash>`` kept)."""
    if isinstance(labels, str) and labels.startswith("custom:"):
        return labels
    return scheme_name(labels)


@dataclass(frozen=True)
class Labels:
    """The labels of one request for one N, resolved once: the value as sent (hashable; the
    runner prompts and scores with it), the N strings and the scheme name profiles are kept
    under. Everything after the decode stage reads these fields instead of re-resolving."""

    spec: LabelSpec
    strings: tuple[str, ...]
    scheme: str
    trie: Any = field(default=None, compare=False, repr=False)
    """The strings' token trie (``app.engine.label_scoring.LabelTrie``), once the service
    has checked that the model can score them: the runner scores with it instead of
    building or looking it up again (None: the runner builds it)."""

    @property
    def n(self) -> int:
        return len(self.strings)

    @classmethod
    def resolve(cls, value: str | Sequence[str], n: int) -> Labels:
        """Raises ValueError (an unknown scheme, a list of the wrong length, duplicates)."""
        spec = label_spec(value)
        strings = resolve_labels(spec, n)
        return cls(spec, tuple(strings), spec if isinstance(spec, str) else _named(strings))


# ---------------------------------------------------------------- the prompt
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
