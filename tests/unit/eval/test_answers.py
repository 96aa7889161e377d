"""The generation baselines' pure parts: the answer parser and the vote."""

from __future__ import annotations

import pytest

from lad_lab.eval.answers import majority_vote, parse_answer, parse_answer_paper

DIGITS = ["1", "2", "3", "4"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 3", 2),
        ("Image 1 shows a star, image 2 a circle. The answer is 2.", 1),
        ('the answer is "4"', 3),
        ("Answer: (1)", 0),
        ("answer is image 3", 2),
        ("The answer is 2. On reflection, the answer is 4", 3),  # the last one counts
        ("3", 2),  # no reasoning, just a label
        (" 4 <|im_end|>", 3),
        ("I would pick image 2 because it is red", 1),  # exactly one label named
        ("image 1 or image 3", None),  # two candidates: not guessed
        ("The answer is 7", None),  # not a label of N = 4
        ("no idea", None),
        ("", None),
    ],
)
def test_parse_answer(text: str, expected: int | None) -> None:
    assert parse_answer(text, DIGITS) == expected


def test_parse_answer_other_schemes() -> None:
    upper = ["A", "B", "C", "D"]
    assert parse_answer("The answer is C", upper) == 2
    assert parse_answer("the answer is c", upper) == 2  # case-insensitive when unambiguous
    words = ["one", "two", "three"]
    assert parse_answer("So the answer is two.", words) == 1
    roman = ["I", "II", "III", "IV"]
    assert parse_answer("The answer is IV", roman) == 3
    assert parse_answer("The answer is II", roman) == 1


def test_majority_vote() -> None:
    assert majority_vote([2, 2, 1, None], 4) == (2, [0.0, 1 / 3, 2 / 3, 0.0])
    winner, shares = majority_vote([3, 1, 1, 3], 4)  # tie: the first sampled of the tied
    assert winner == 3 and shares == [0.0, 0.5, 0.0, 0.5]
    assert majority_vote([None, None], 3) == (None, [1 / 3] * 3)
    with pytest.raises(ValueError):
        majority_vote([5], 4)


def test_parse_answer_paper() -> None:
    assert parse_answer_paper("x </think> 3", DIGITS, answer_is=False) == 2
    assert parse_answer_paper("1 then 2 and 4", DIGITS, answer_is=False) == 3  # the last
    assert parse_answer_paper("The answer is 2, not 3", DIGITS) == 1  # the first "answer is"
    assert parse_answer_paper("The answer is 9, so 1", DIGITS) is None  # theirs: no vote
    assert parse_answer_paper("the answer is  2", DIGITS) == 1  # two spaces: no phrase, last
    assert parse_answer_paper("image 04", DIGITS, answer_is=False) == 3  # compared as integers
    assert parse_answer_paper("5 or 0", DIGITS, answer_is=False) is None
    assert parse_answer_paper("no digits", DIGITS) is None
