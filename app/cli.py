"""The ``lad`` command: one entry point that hands its remaining arguments to a module's main."""

from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> module whose ``main(argv: list[str]) -> int | None`` runs it
COMMANDS: dict[str, str] = {
    "serve": "app.main",
    "bench engine": "app.bench.engine",
    "bench service": "app.bench.service",
    "eval": "app.eval.cli",
    "demo train": "app.demo.train",
    "demo eval": "app.eval.cli",  # an alias: the demo world is lad eval's default dataset
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``lad <command> [<sub-command>] args...`` lazily, so ``lad --help`` stays fast."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for words in sorted(COMMANDS, key=lambda c: -len(c.split())):
        n = len(words.split())
        if argv[:n] == words.split():
            module = importlib.import_module(COMMANDS[words])
            result = module.main(argv[n:])
            return int(result or 0)
    parser = argparse.ArgumentParser(prog="lad", description=__doc__)
    parser.add_argument("command", choices=sorted(COMMANDS), help="what to run")
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
