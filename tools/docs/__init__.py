"""Generated blocks of the documentation pages: ``python -m tools.docs NAME [--write | --check]``.

Each block lies in one page between two HTML-comment markers and is rebuilt from its source
(the settings and the error table, the adapter registry, the benchmark records), so it is
never typed by hand. See docs/development.md, "Generated documentation".
"""
