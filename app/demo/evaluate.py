"""``lad demo eval``: an alias of ``lad eval``, whose default dataset is the demo world.

The one evaluator is ``app.eval`` (DESIGN §2.7); this module only names the command.
"""

from __future__ import annotations

from app.eval import cli


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, prog="lad demo eval")
