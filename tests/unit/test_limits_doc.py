"""docs/api.md's "Limits and errors" tables are generated from the code and kept current."""

from __future__ import annotations

from app import errors
from app.settings import Settings
from tools.docs.limits import LIMITS, PAGE, main, page_block, tables


def test_page_tables_are_current() -> None:
    assert main(["--check"]) == 0, "run `python -m tools.docs limits --write`"
    assert page_block(PAGE.read_text()) == tables()


def test_every_error_code_and_every_limit_setting_is_documented() -> None:
    text = tables()
    for cls in errors.ERRORS:
        assert f"| {cls.status} | `{cls.code}` |" in text
    documented = {name for name, _ in LIMITS}
    limits = {n for n in Settings.model_fields if n.startswith("max_") or n.endswith("_timeout_s")}
    assert limits - {"max_batch_size", "max_wait_ms"} <= documented
    assert len({cls.code for cls in errors.ERRORS}) == len(errors.ERRORS)  # codes are unique
