"""One help style for every ``lad`` command: each option's default is shown in --help.

Every command module builds its parser with :func:`command_parser` instead of
``argparse.ArgumentParser``, so ``lad <command> --help`` reads the same everywhere.
"""

from __future__ import annotations

import argparse
from typing import Any


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help text followed by the option's default, when it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower() or default is None or default is argparse.SUPPRESS
            or default is False or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)".strip()


class RawDescriptionDefaultsHelpFormatter(
    argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter
):
    """Keeps the description's own line breaks, and shows defaults."""


def command_parser(prog: str, **kwargs: Any) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` whose --help shows defaults; ``raw_description=True`` keeps
    the description's line breaks."""
    raw = kwargs.pop("raw_description", False)
    formatter = RawDescriptionDefaultsHelpFormatter if raw else DefaultsHelpFormatter
    return argparse.ArgumentParser(prog=prog, formatter_class=formatter, **kwargs)
