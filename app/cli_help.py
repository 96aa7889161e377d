"""One help style for every ``lad`` command: each option's default is shown in --help.

Every command module builds its parser with :func:`command_parser` instead of
``argparse.ArgumentParser``, so ``lad <command> --help`` reads the same everywhere. A
command whose options are a config dataclass declares each one on its field with
:func:`flag` and builds the parser with :func:`add_config_flags`, so a default and its
help text live in one place. A boolean option is a flag everywhere (:class:`BooleanFlag`):
``--x`` alone, ``--x false`` / ``--x true``, and ``--no-x``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from types import UnionType
from typing import Any, get_args, get_origin, get_type_hints

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def parse_bool(text: str) -> bool:
    """``true``/``false`` (also 1/0, yes/no, on/off, any case), as pydantic reads LAD_* values."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


class BooleanFlag(argparse.Action):
    """A boolean option typed as a flag: ``--x`` sets True, ``--x false`` still works (the
    form of the environment variables), and ``--no-x`` sets False."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        negated = [
            "--no-" + s[2:] for s in option_strings if s.startswith("--") and "--no-" not in s
        ]
        kwargs.setdefault("metavar", "true|false")
        super().__init__([*option_strings, *negated], dest, nargs="?", type=parse_bool, **kwargs)
        self.negated = frozenset(negated)  # not the option's own spelling, e.g. --no-prior

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string in self.negated:
            if values is not None:
                parser.error(f"{option_string} takes no value")
            values = False
        setattr(namespace, self.dest, True if values is None else values)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help text followed by the option's default, when it has one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default is None
            or default is argparse.SUPPRESS
            or (default is False and not isinstance(action, BooleanFlag))
            or not action.option_strings
            or action.nargs == 0
        ):
            return text
        return f"{text} (default: %(default)s)".strip()

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, BooleanFlag):  # --x [true|false], --no-x
            *named, negated = action.option_strings
            return ", ".join([*(f"{n} [{action.metavar}]" for n in named), negated])
        return super()._format_action_invocation(action)


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


@dataclass(frozen=True)
class Flag:
    """How a config field appears on the command line (kept in the field's metadata)."""

    help: str
    flags: tuple[str, ...] = ()  # default: --field-name (--no-field-name for a True bool)
    choices: Sequence[str] | None = None
    type: Callable[[str], Any] | None = None  # default: from the annotation
    group: str | None = None  # a key of the groups given to add_config_flags
    secret: bool = False  # never written into the run's records (a token)


def flag(
    default: Any = MISSING, *, factory: Callable[[], Any] | None = None, help: str, **options: Any
) -> Any:
    """A dataclass field that is also a command-line option (see :func:`add_config_flags`)."""
    meta = {"cli": Flag(help=help, **options)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def cli_flag(f: Field[Any]) -> Flag | None:
    """The field's command-line option, None for a field that is not one."""
    return f.metadata.get("cli")


def _value_type(hint: Any) -> tuple[Any, bool]:
    """(the type argparse converts one value with, whether it takes one or more values):
    ``int | None`` -> (int, False), ``list[Path] | None`` -> (Path, True)."""
    args = [a for a in get_args(hint) if a is not type(None)]
    if isinstance(hint, UnionType) and len(args) == 1:
        hint = args[0]
    if get_origin(hint) is list:
        return get_args(hint)[0], True
    return hint, False


def add_config_flags(
    parser: argparse.ArgumentParser,
    config: type,
    groups: dict[str, tuple[str, str | None]] | None = None,
) -> None:
    """One option per field of the dataclass ``config`` that has a :class:`Flag`, in field
    order, with the field's default and ``dest`` its name: the parsed namespace is the
    config's keyword arguments, so a default or a help text is written once, in the config.
    ``groups`` maps a Flag's group to (title, description)."""
    hints = get_type_hints(config)
    made: dict[str, Any] = {}
    for f in fields(config):
        spec = cli_flag(f)
        if spec is None:
            continue
        where: Any = parser
        if spec.group is not None:
            if spec.group not in made:
                title, description = (groups or {})[spec.group]
                made[spec.group] = parser.add_argument_group(title, description)
            where = made[spec.group]
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        name = "--" + f.name.replace("_", "-")
        kwargs: dict[str, Any] = {"dest": f.name, "default": default, "help": spec.help}
        if hints[f.name] is bool and spec.flags:  # its own spelling, e.g. --quiet: a switch
            kwargs["action"] = "store_false" if default else "store_true"
        elif hints[f.name] is bool:
            kwargs["action"] = BooleanFlag
        else:
            value_type, many = _value_type(hints[f.name])
            kwargs["type"] = spec.type or (None if value_type is str else value_type)
            if many and spec.type is None:
                kwargs["nargs"] = "+"
            if spec.choices is not None:
                kwargs["choices"] = spec.choices
        where.add_argument(*(spec.flags or (name,)), **kwargs)
