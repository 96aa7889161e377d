"""Settings read LAD_* variables (and nothing else does); lists parse in three spellings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from app.method.methods import MethodConfig
from app.settings import DEFAULT_STORE_URL, PARTS, Settings, part_of

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = {
    name: str(field.default - 1 if field.default > 1 else field.default + 1)
    for name, field in Settings.model_fields.items()
    if type(field.default) is int
} | {"model": "Qwen/Qwen2.5-VL-3B-Instruct", "store_url": "memory://", "admin_token": "s3cret"}
"""A value other than the default for each integer setting and a few others, as the
environment spells it."""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("LAD_"):
            monkeypatch.delenv(name)


def _settings(**kwargs) -> Settings:
    return Settings(_env_file=None, **kwargs)


def test_defaults() -> None:
    s = _settings()
    assert s.model == "demo" and s.device == "auto" and s.dtype == "auto"
    assert s.store_url == DEFAULT_STORE_URL == "var/profiles"
    assert (s.max_images, s.max_batch_size, s.max_queue) == (12, 8, 64)
    assert (s.top_k, s.tau, s.posterior_variant, s.mixture) == (2, 5.0, "reference", "linear")
    assert s.layers is None and s.retrieve_token is None and s.admin_token is None
    assert s.fallback_to_vanilla is False
    assert (s.host, s.port) == ("127.0.0.1", 8000)


def test_environment_with_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAD_MODEL", "Qwen/Qwen2.5-VL-3B-Instruct")
    monkeypatch.setenv("LAD_STORE_URL", "redis://cache:6379/0")
    monkeypatch.setenv("LAD_MAX_BATCH_SIZE", "16")
    monkeypatch.setenv("LAD_FALLBACK_TO_VANILLA", "true")
    monkeypatch.setenv("LAD_ADMIN_TOKEN", "s3cret")
    monkeypatch.setenv("LAD_POSTERIOR_VARIANT", "logmean")
    monkeypatch.setenv("LAD_TAU", "2.5")
    monkeypatch.setenv("MODEL", "ignored-without-prefix")
    s = _settings()
    assert s.model == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert s.store_url == "redis://cache:6379/0"
    assert s.max_batch_size == 16 and s.fallback_to_vanilla is True
    assert s.admin_token is not None and s.admin_token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(s)
    assert s.posterior_variant == "logmean" and s.tau == 2.5


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("[10, 11]", [10, 11]),
        ("10,11", [10, 11]),
        ("13,10", [10, 13]),
        ("10-13", [10, 11, 12, 13]),
        ("7", [7]),
        ("", None),
    ],
)
def test_layers_spellings(monkeypatch: pytest.MonkeyPatch, raw: str, expected) -> None:
    monkeypatch.setenv("LAD_LAYERS", raw)
    assert _settings().layers == expected


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LAD_LAYERS", "3,3"),
        ("LAD_LAYERS", "5-2"),
        ("LAD_LAYERS", "a,b"),
        ("LAD_TOP_K", "0"),
        ("LAD_TAU", "-1"),
        ("LAD_MIXTURE", "cubic"),
        ("LAD_MAX_IMAGES", "1"),
        ("LAD_MAX_QUEUE", "0"),
        ("LAD_PORT", "70000"),
        ("LAD_PROMPT_VARIANT", "cot"),
    ],
)
def test_invalid_values_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        _settings()


def test_blank_tokens_mean_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAD_RETRIEVE_TOKEN", "  ")
    assert _settings().retrieve_token is None


def test_the_method_config_is_built_from_the_settings() -> None:
    """One definition of the hyper-parameters: MethodConfig, filled from the method part."""
    s = _settings(top_k=3, mixture="log")
    assert s.method_config() == MethodConfig(top_k=3, mixture="log")


def test_sink_guard_is_a_setting_and_the_cot_ones_are_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LAD_SINK_GUARD", "false")
    monkeypatch.setenv("LAD_COT_PROMPT", "Think. Caption: {query} Answer: ")
    s = Settings(_env_file=None)
    assert s.sink_guard is False and s.method_config().sink_guard is False
    assert not hasattr(s, "cot_prompt") and not hasattr(s, "cot_max_new_tokens")
    monkeypatch.delenv("LAD_SINK_GUARD")
    assert Settings(_env_file=None).sink_guard is True


def test_every_setting_is_in_exactly_one_part() -> None:
    owners = [name for part in PARTS.values() for name in part.model_fields]
    assert len(owners) == len(set(owners)), "a setting in two parts"
    assert set(owners) == set(Settings.model_fields)
    assert part_of("max_images") == "limits" and part_of("store_url") == "store"


def test_the_documented_variables_still_map(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every LAD_* of docs/configuration.md's table is read into its field, by the whole
    settings and by the part that owns it alone."""
    table = (ROOT / "docs" / "configuration.md").read_text().split("## Settings", 1)[1]
    documented = set(re.findall(r"`LAD_([A-Z_]+)`", table.split("\n## ", 1)[0]))
    assert documented == {name.upper() for name in Settings.model_fields}
    for name in sorted(documented):
        field = name.lower()
        value = SAMPLE.get(field)
        if value is None:
            continue
        monkeypatch.setenv(f"LAD_{name}", value)
        whole = getattr(Settings(_env_file=None), field)
        alone = getattr(PARTS[part_of(field)](_env_file=None), field)
        if isinstance(whole, SecretStr):
            whole, alone = whole.get_secret_value(), alone.get_secret_value()
        assert whole == type(whole)(value) and whole == alone, name
        monkeypatch.delenv(f"LAD_{name}")


def test_env_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = tmp_path / ".env"
    env.write_text("LAD_MAX_WAIT_MS=12.5\nLAD_KEEP_VERSIONS=9\n")
    s = Settings(_env_file=str(env))
    assert s.max_wait_ms == 12.5 and s.keep_versions == 9


def test_image_formats_parse_and_are_checked() -> None:
    assert _settings(image_formats="jpeg, png").image_formats == ["JPEG", "PNG"]
    assert _settings(image_formats='["WEBP"]').image_formats == ["WEBP"]
    assert "TIFF" not in _settings().image_formats
    for bad in ("EPS", "JPEG,PDF", ""):
        with pytest.raises(ValidationError):
            _settings(image_formats=bad)


def test_limits_are_bounded() -> None:
    with pytest.raises(ValidationError):
        _settings(max_images=65)  # N is at most 64 anywhere
    with pytest.raises(ValidationError):
        _settings(max_aspect_ratio=250)  # the image processors refuse >= 200


@pytest.mark.parametrize(
    ("host", "token", "opt_out", "refused"),
    [
        ("127.0.0.1", None, False, False),
        ("localhost", None, False, False),
        ("::1", None, False, False),
        ("127.0.0.2", None, False, False),
        ("0.0.0.0", None, False, True),
        ("::", None, False, True),
        ("10.1.2.3", None, False, True),
        ("example.org", None, False, True),
        ("0.0.0.0", "s3cret-0123456789abcdef", False, False),
        ("0.0.0.0", None, True, False),
        ("0.0.0.0", "  ", False, True),
    ],
)
def test_open_admin_routes_are_refused_off_loopback(host, token, opt_out, refused) -> None:
    settings = _settings(host=host, admin_token=token, allow_open_admin=opt_out)
    problem = settings.exposure_problem()
    assert (problem is not None) is refused
    if refused:
        assert "LAD_ADMIN_TOKEN" in problem and "LAD_ALLOW_OPEN_ADMIN" in problem


@pytest.mark.parametrize(
    ("host", "token", "opt_out", "refused"),
    [
        ("0.0.0.0", "x", False, True),
        ("0.0.0.0", "x", True, True),  # the opt-out is for no token, not a guessable one
        ("0.0.0.0", "a" * 15, False, True),
        ("0.0.0.0", "a" * 16, False, False),
        ("127.0.0.1", "x", False, False),  # loopback: as without a token
    ],
)
def test_a_short_admin_token_is_refused_off_loopback(host, token, opt_out, refused) -> None:
    settings = _settings(host=host, admin_token=token, allow_open_admin=opt_out)
    problem = settings.exposure_problem()
    assert (problem is not None) is refused
    if refused:
        assert "LAD_MIN_ADMIN_TOKEN_CHARS=16" in problem
        assert f"of {len(token)} characters" in problem
