"""Label schemes (DESIGN §2.1, §2.6): names, limits, custom lists, phrases, text parsing."""

from __future__ import annotations

import pytest

from app.engine.labels import (
    label_phrases,
    parse_labels,
    resolve_labels,
    scheme_name,
    stored_scheme,
)


def test_named_schemes() -> None:
    assert resolve_labels("digits", 12) == [str(k) for k in range(1, 13)]
    assert resolve_labels("upper", 4) == ["A", "B", "C", "D"]
    assert resolve_labels("lower", 26)[-1] == "z"
    roman14 = "I II III IV V VI VII VIII IX X XI XII XIII XIV"
    assert " ".join(resolve_labels("roman", 14)) == roman14
    roman = resolve_labels("roman", 64)
    assert (roman[39], roman[48], roman[63]) == ("XL", "XLIX", "LXIV")
    words = resolve_labels("words", 64)
    assert words[:3] == ["one", "two", "three"]
    assert (words[11], words[19], words[20], words[63]) == (
        "twelve",
        "twenty",
        "twenty-one",
        "sixty-four",
    )
    for name in ("digits", "roman", "words"):
        assert len(set(resolve_labels(name, 64))) == 64


def test_scheme_errors() -> None:
    with pytest.raises(ValueError, match="at most 26"):
        resolve_labels("upper", 27)
    with pytest.raises(ValueError, match="unknown label scheme"):
        resolve_labels("greek", 3)
    with pytest.raises(ValueError, match="positive"):
        resolve_labels("digits", 0)
    with pytest.raises(ValueError, match="has 2 labels but N=3"):
        resolve_labels(["x", "y"], 3)
    with pytest.raises(ValueError, match="distinct"):
        resolve_labels(["x", "y", "x"], 3)
    with pytest.raises(ValueError, match="non-empty"):
        resolve_labels(["x", "", "z"], 3)


def test_custom_labels_and_scheme_names() -> None:
    assert resolve_labels(("cat", "dog"), 2) == ["cat", "dog"]
    assert scheme_name("roman") == "roman"
    custom = scheme_name(["cat", "dog"])
    assert custom.startswith("custom:") and len(custom) == len("custom:") + 8
    assert custom == scheme_name(("cat", "dog"))  # stable
    assert custom != scheme_name(["dog", "cat"])  # order matters
    assert scheme_name(["1", "2", "3"]) == "digits"  # same labels, same profile
    with pytest.raises(ValueError):
        scheme_name("greek")


def test_label_phrases() -> None:
    assert label_phrases(resolve_labels("digits", 4)) == ("indexed from 1 to 4", "the index number")
    assert label_phrases(resolve_labels("upper", 4)) == ("labeled from A to D", "the label")
    assert label_phrases(resolve_labels("words", 3)) == ("labeled from one to three", "the label")


def test_parse_labels_text() -> None:
    assert parse_labels("digits") == "digits"
    assert parse_labels(' ["x", "y"] ') == ("x", "y")
    assert parse_labels("a, b ,c") == ("a", "b", "c")
    assert parse_labels("custom:0123abcd") == "custom:0123abcd"
    for bad in ("[1, 2]", "[not json", "klingon"):
        with pytest.raises(ValueError):
            parse_labels(bad)


def test_stored_scheme_names_what_a_profile_is_stored_under() -> None:
    assert stored_scheme("upper") == "upper"
    assert stored_scheme(("A", "B", "C")) == "upper"  # equal to a named scheme
    assert stored_scheme("custom:0123abcd") == "custom:0123abcd"
    custom = stored_scheme(("cat", "dog"))
    assert custom.startswith("custom:") and custom == scheme_name(["cat", "dog"])
