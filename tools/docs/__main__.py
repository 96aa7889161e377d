"""``python -m tools.docs {limits,families,bench,exits,matrix,all} [--write | --check]``.

limits    docs/api.md "Limits and errors" (the settings and the error table)
families  docs/models.md family table (the adapter registry)
bench     docs/benchmarks.md tables (the JSON records under bench/results/)
exits     docs/operations.md table of `lad serve` exit statuses (app.serve.EXIT_CODES)
matrix    docs/models.md model matrix (lad_lab/testing/model_matrix.json)
stages    docs/design.md stage table (app.service.pipeline.STAGES)
all       every block above, with the same flag

No flag prints the block(s); ``--write`` rewrites the page in place; ``--check`` exits 1 when
a page is stale (the unit tests run the check).
"""

from __future__ import annotations

import importlib
import sys

GENERATORS: dict[str, str] = {
    "limits": "tools.docs.limits",
    "families": "tools.docs.families",
    "bench": "tools.docs.bench_tables",
    "exits": "tools.docs.exit_codes",
    "matrix": "tools.docs.model_matrix",
    "stages": "tools.docs.stages",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name, rest = (argv[0], argv[1:]) if argv else ("", [])
    if name in GENERATORS:
        return int(importlib.import_module(GENERATORS[name]).main(rest) or 0)
    if name == "all":
        results = [importlib.import_module(m).main(rest) for m in GENERATORS.values()]
        return max(int(r or 0) for r in results)
    print(__doc__, file=sys.stderr)
    return 0 if name in ("-h", "--help") else 2


if __name__ == "__main__":
    raise SystemExit(main())
