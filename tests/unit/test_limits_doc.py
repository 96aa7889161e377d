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


def test_configuration_and_api_say_the_same_of_what_a_limit_or_token_covers() -> None:
    """Both pages take it from the route table (the body limit and the auth of each route)."""
    import re

    from tools.docs.limits import covers

    configuration = (PAGE.parent / "configuration.md").read_text()
    api = PAGE.read_text()
    for name in ("max_body_bytes", "max_calibrate_body_bytes", "retrieve_token", "admin_token"):
        text = covers(name)
        assert text is not None
        row = re.search(rf"^\| `LAD_{name.upper()}` \|.*$", configuration, flags=re.M)
        assert row is not None and row.group(0).endswith(f"| {text} |"), (name, row)
        if name != "retrieve_token":  # environment-only: not a limit of api.md's table
            assert f"| {text} | `LAD_{name.upper()}` |" in api, name
    assert "`/v1/rerank`" in covers("max_body_bytes")
    assert "`POST /v1/profiles/{name}/refresh`" in covers("admin_token")
