"""The README's "Limits and errors" tables are generated from the code and kept current."""

from __future__ import annotations

from app import errors
from app.limits_doc import LIMITS, README, main, readme_block, tables
from app.settings import Settings


def test_readme_tables_are_current() -> None:
    assert main(["--check"]) == 0, "run `scripts/dev lad docs limits --write`"
    assert readme_block(README.read_text()) == tables()


def test_every_error_code_and_every_limit_setting_is_documented() -> None:
    text = tables()
    for cls in errors.ERRORS:
        assert f"| {cls.status} | `{cls.code}` |" in text
    documented = {name for name, _ in LIMITS}
    limits = {n for n in Settings.model_fields if n.startswith("max_") or n.endswith("_timeout_s")}
    assert limits - {"max_batch_size", "max_wait_ms"} <= documented
    assert len({cls.code for cls in errors.ERRORS}) == len(errors.ERRORS)  # codes are unique
