"""The generation baselines' pure parts (DESIGN §2.5): the answer parser and the vote.

``cot`` asks for reasoning first and a final "The answer is <label>"; ``self_consistency``
samples several such paths and takes the majority of the parsed answers (the prompt text
is ``app.engine.labels.cot_prompt_text``). ``parse_answer_paper`` is the authors' reading
of a generated answer (the "paper" protocol). Pure functions over strings and integers.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

SELF_CONSISTENCY_SAMPLES = 10
SELF_CONSISTENCY_TEMPERATURE = 0.7

_ANSWER_IS = re.compile(
    r"answer\s*(?:is|:|=)?\s*[:=\-]?\s*[\"'(\[<*]*\s*(?:image|picture|label|index|number|no\.?)?"
    r"\s*[#:]?\s*([A-Za-z0-9]+)",
    re.IGNORECASE,
)
_WORD = re.compile(r"[A-Za-z0-9]+")


def _label_index(token: str, labels: Sequence[str]) -> int | None:
    """The position whose label is ``token``: exact match first, then case-insensitive if
    that is unambiguous (so "b" reads as "B" unless the scheme has both)."""
    if token in labels:
        return list(labels).index(token)
    folded = [i for i, label in enumerate(labels) if label.lower() == token.lower()]
    return folded[0] if len(folded) == 1 else None


def parse_answer(text: str, labels: Sequence[str]) -> int | None:
    """The 0-based position a generated answer names, or None when it cannot be read.

    In order: the last "answer is X" / "answer: X" (also "answer is image 3", quotes or
    brackets around X) whose X is a label; else a text that is a label and nothing else
    (the model skipped the reasoning); else the one label a text names if it names exactly
    one distinct label as a word. Anything else (no label, several candidates) is None, so
    unparseable answers are counted, never guessed.
    """
    for match in reversed(list(_ANSWER_IS.finditer(text))):
        index = _label_index(match.group(1), labels)
        if index is not None:
            return index
    words = _WORD.findall(text)
    if len(words) == 1:
        return _label_index(words[0], labels)
    named = {i for w in words if (i := _label_index(w, labels)) is not None and w in labels}
    return named.pop() if len(named) == 1 else None


_PAPER_ANSWER_IS = re.compile(r"[Tt]he answer is (\d+)")
_NUMBER = re.compile(r"\d+")


def parse_answer_paper(text: str, labels: Sequence[str], *, answer_is: bool = True) -> int | None:
    """The authors' parser (digit labels, numbers compared as integers, so "04" is 4).

    With ``answer_is`` (their self-consistency vote): the first "The answer is <d>" decides,
    and a number that is no label gives no vote; only a text without that phrase falls back
    to the last number that is a label. Without (vanilla, instruction, cot): the last number
    in the text that is a label. None when there is none (counted wrong)."""

    def position(word: str) -> int | None:
        value = str(int(word))
        return list(labels).index(value) if value in labels else None

    if answer_is:
        match = _PAPER_ANSWER_IS.search(text)
        if match:
            return position(match.group(1))
    valid = [p for w in _NUMBER.findall(text) if (p := position(w)) is not None]
    return valid[-1] if valid else None


def majority_vote(answers: Sequence[int | None], n: int) -> tuple[int | None, list[float]]:
    """Self-consistency: the most frequent parsed answer and the vote shares (N,).

    Unparseable samples (None) do not vote. Ties go to the tied answer that was sampled
    first (the samples are random, so this favours no position). No parseable sample:
    (None, uniform shares).
    """
    votes = [a for a in answers if a is not None]
    if any(not 0 <= a < n for a in votes):
        raise ValueError(f"answers must be positions in 0..{n - 1}")
    if not votes:
        return None, [1.0 / n] * n
    counts = Counter(votes)
    top = max(counts.values())
    winner = next(a for a in votes if counts[a] == top)
    return winner, [counts.get(j, 0) / len(votes) for j in range(n)]
