"""The ``lad`` command: help and version, and --help of every command without torch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
from app.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("HEAVY:", ",".join(heavy))
raise SystemExit(code)
"""


def lad(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_lad_help_lists_every_command_in_plain_words() -> None:
    done = lad("--help")
    assert done.returncode == 0, done.stderr
    for command, (_, text) in COMMANDS.items():
        assert f"lad {command}" in done.stdout and text in done.stdout
    assert "HEAVY: \n" in done.stdout


def test_lad_version() -> None:
    done = lad("--version")
    assert done.returncode == 0 and done.stdout.startswith("lad-serve 0.")


def test_unknown_command_is_a_usage_error() -> None:
    done = lad("frobnicate")
    assert done.returncode == 2 and "unknown command" in done.stderr


def prose(help_text: str) -> list[str]:
    """The sentences of a --help: its description, group descriptions and epilog, each
    paragraph unwrapped (not the usage, the option lines or indented examples)."""
    found = []
    for paragraph in re.split(r"\n\s*\n", help_text):
        lines = paragraph.splitlines()
        if not lines or lines[0].startswith(("usage:", " ")):
            continue
        if lines[0].endswith(":") and len(lines) > 1 and lines[1].startswith(" "):
            lines = lines[1:]  # a group's title, then its description before its options
        lines = lines[: next((i for i, x in enumerate(lines) if re.match(r"\s+-", x)), None)]
        if lines:
            found.append(" ".join(x.strip() for x in lines))
    return found


def test_the_prose_of_a_help_is_found() -> None:
    text = "usage: lad x\n\nFirst line\ncut at a word\n\noptions:\n  -h  help\n\nend."
    assert prose(text) == ["First line cut at a word", "end."]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_command_help_imports_no_torch_and_shows_defaults(command: str) -> None:
    done = lad(*command.split(), "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: lad {command}")
    assert "HEAVY: \n" in done.stdout, f"`lad {command} --help` imported torch"
    assert "default" in done.stdout
    help_text = done.stdout.split("HEAVY:")[0]
    assert prose(help_text), f"`lad {command} --help` says nothing about the command"
    for paragraph in prose(help_text):  # never cut mid-sentence (a docstring's first line)
        assert paragraph[-1] in ".:)?!`", f"`lad {command} --help` is cut: ...{paragraph[-60:]}"


def test_lad_help_lists_the_subcommands_that_modules_dispatch() -> None:
    """`lad eval rerank` is dispatched by lad_lab.eval.cli too; the overview names it."""
    assert "eval rerank" in COMMANDS and COMMANDS["eval rerank"][0] == "lad_lab.eval.rerank"
    assert "lad eval rerank" in lad("--help").stdout


def test_boolean_options_are_flags_that_still_take_a_value() -> None:
    from app.serve import build_parser, settings_from
    from lad_lab.eval.cli import config_from

    assert settings_from(["--trust-remote-code"]).trust_remote_code is True
    assert settings_from(["--trust-remote-code", "false"]).trust_remote_code is False
    assert settings_from(["--allow-open-admin", "TRUE"]).allow_open_admin is True
    assert settings_from(["--no-sink-guard"]).sink_guard is False
    assert settings_from([]).trust_remote_code is False
    with pytest.raises(SystemExit):
        settings_from(["--trust-remote-code", "maybe"])
    shown = build_parser().format_help()
    assert "--trust-remote-code [true|false], --no-trust-remote-code" in shown
    assert config_from(["--dry-run", "--zero-bias", "false"]).dry_run is True
    assert config_from(["--sink-guard", "false"]).sink_guard is False
    assert config_from(["--no-sink-guard", "--quiet"]).progress is False


def test_serve_help_offers_every_setting_but_the_tokens() -> None:
    from app.settings import Settings

    done = lad("serve", "--help")
    for name in Settings.model_fields:
        flag = "--" + name.replace("_", "-")
        if name.endswith("_token"):
            assert flag not in done.stdout
        else:
            assert flag in done.stdout and f"LAD_{name.upper()}" in done.stdout, name


def test_serve_refuses_invalid_settings_with_a_message(capsys) -> None:
    from app.serve import EXIT_BAD_SETTINGS, main

    assert main(["--max-batch-size", "0", "--log-format", "xml"]) == EXIT_BAD_SETTINGS
    out = capsys.readouterr().out
    assert "invalid settings" in out and "max_batch_size" in out and "log_format" in out


def test_flags_override_the_environment(monkeypatch) -> None:
    from app.serve import settings_from

    monkeypatch.setenv("LAD_MAX_BATCH_SIZE", "4")
    monkeypatch.setenv("LAD_PORT", "9000")
    settings = settings_from(["--max-batch-size", "16", "--layers", "2-3"])
    assert settings.max_batch_size == 16 and settings.port == 9000
    assert settings.layers == [2, 3]


def test_each_exit_status_is_documented_in_the_help_and_the_operations_page() -> None:
    from app.serve import EXIT_CODES, build_parser
    from tools.docs import exit_codes

    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES), "one cause per status"
    shown = " ".join(build_parser().format_help().split())
    for code, text in EXIT_CODES.items():
        assert f"{code} {text}" in shown
    assert exit_codes.main(["--check"]) == 0, "run `python -m tools.docs exits --write`"


LAB_COMMANDS = sorted(c for c, (module, _) in COMMANDS.items() if module.startswith("lad_lab."))


def test_every_command_but_serve_is_the_labs() -> None:
    assert len(COMMANDS) == 19
    assert [c for c in COMMANDS if c not in LAB_COMMANDS] == ["serve"]


@pytest.mark.parametrize("missing", ["matplotlib", "lad_lab"])
@pytest.mark.parametrize("command", ["eval", "bench engine", "demo train", "model tiny"])
def test_a_lab_command_without_the_lab_says_which_extra_in_one_line(
    command: str, missing: str, monkeypatch, capsys
) -> None:
    """A serving install (no lad_lab, or no matplotlib of the `lab` extra): one line, exit 2,
    no traceback; `lad serve` is not affected."""
    from app.cli import main

    monkeypatch.setitem(sys.modules, missing, None)  # `import matplotlib` now raises
    with pytest.raises(ModuleNotFoundError):
        __import__(missing)
    assert main([*command.split(), "--help"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(
        f"lad {command} needs the lab: pip install 'lad-serve[lab]' "
        "(scripts/dev setup dev installs it)"
    ), err
    assert repr(missing) in err
    assert main(["serve", "--help"]) == 0
    assert "usage: lad serve" in capsys.readouterr().out


def test_the_lab_modules_are_the_lab_extra() -> None:
    """app.cli.LAB_MODULES (what a lab command looks for) names the `lab` extra of
    pyproject.toml, whose packages the service's own dependencies do not list."""
    import tomllib

    from app.cli import LAB_MODULES

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = [re.split(r"[<>=!~ \[]", r)[0] for r in project["optional-dependencies"]["lab"]]
    assert sorted(LAB_MODULES) == sorted(["lad_lab", *(e.replace("-", "_") for e in extra)])
    service = {re.split(r"[<>=!~ \[]", r)[0] for r in project["dependencies"]}
    assert not service & set(extra), service & set(extra)
    assert "lad-serve[lab,redis]" in project["optional-dependencies"]["dev"]
