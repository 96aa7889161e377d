"""The ``lad`` command: help and version, and --help of every command without torch."""

from __future__ import annotations

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


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_command_help_imports_no_torch_and_shows_defaults(command: str) -> None:
    done = lad(*command.split(), "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: lad {command}")
    assert "HEAVY: \n" in done.stdout, f"`lad {command} --help` imported torch"
    assert "default" in done.stdout


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
