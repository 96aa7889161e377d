"""``lad eval``'s parser is generated from ``EvalConfig``: every field but the recorded command
line is an option, parsing nothing gives the config's own defaults, values convert to the
field's type, and --help shows each default."""

from __future__ import annotations

import argparse
import contextlib
import io
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from app.cli_help import cli_flag
from lad_lab.eval import cli
from lad_lab.eval.config import SECRET_FLAGS, EvalConfig

NOT_OPTIONS = {"command"}


def _actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in cli.build_parser()._actions if a.dest != "help"}


def _default(name: str) -> object:
    f = next(f for f in fields(EvalConfig) if f.name == name)
    return f.default_factory() if f.default_factory is not MISSING else f.default


def test_every_field_is_an_option_and_every_option_a_field() -> None:
    names = {f.name for f in fields(EvalConfig)}
    assert set(_actions()) == names - NOT_OPTIONS
    assert all(cli_flag(f) is None for f in fields(EvalConfig) if f.name in NOT_OPTIONS)


def test_each_option_defaults_to_its_field() -> None:
    for dest, action in _actions().items():
        assert action.default == _default(dest), dest
    parsed = cli.config_from([])
    assert parsed == EvalConfig(command="lad eval ")


def test_list_defaults_are_fresh_per_parse() -> None:
    first = cli.config_from([])
    first.ns.append(9)
    first.methods.clear()
    again = cli.config_from([])
    assert again.ns == [4] and again.methods == EvalConfig().methods != []


def test_values_convert_to_the_field_type() -> None:
    c = cli.config_from(
        [
            "-n",
            "3",
            "5",
            "--data",
            "x.jsonl",
            "--tau",
            "2.5",
            "--layers",
            "2-4",
            "--setting",
            "random",
            "adversarial",
            "--item-seeds",
            "1",
            "2",
            "--no-sink-guard",
            "--quiet",
            "--zero-bias",
            "--threads",
            "2",
            "--methods",
            "vanilla",
            "agd",
            "--url",
            "http://h:1",
            "--token",
            "t",
            "--feedback-rate",
            "0.5",
        ]
    )
    assert c.ns == [3, 5] and c.data == Path("x.jsonl") and c.tau == 2.5
    assert c.layers == [2, 3, 4] and c.settings == ["random", "adversarial"]
    assert c.item_seeds == [1, 2] and c.threads == 2 and c.methods == ["vanilla", "agd"]
    assert c.sink_guard is False and c.progress is False and c.zero_bias is True
    assert c.url == "http://h:1" and c.feedback_rate == 0.5
    assert "token" not in c.to_dict() and {"token", "admin_token"} == SECRET_FLAGS


def test_a_field_spelled_no_x_is_set_by_its_flag() -> None:
    """``--no-prior`` is the ``no_prior`` field's own flag, not the negation of a ``prior``."""
    assert cli.config_from(["--no-prior"]).no_prior is True
    assert cli.config_from(["--no-prior", "false"]).no_prior is False
    assert cli.config_from(["--no-sink-guard"]).sink_guard is False


def test_choices_come_from_the_field() -> None:
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        cli.config_from(["--dataset", "nope"])
    choices = _actions()["dataset"].choices
    assert choices is not None and "synthetic" in choices


def test_help_shows_every_default() -> None:
    text = " ".join(cli.build_parser().format_help().split())  # the wrapping undone
    for dest, action in _actions().items():
        assert action.option_strings[-1] in text, dest
        default = action.default
        if action.nargs == 0 or default is None:
            continue  # an on/off flag, or a default the help text explains
        if not isinstance(default, list):
            assert f"(default: {default})" in text, dest
    assert "(default: [4])" in text and "(default: 200)" in text
