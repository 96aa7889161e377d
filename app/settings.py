"""Service settings: the one place that reads the environment (prefix ``LAD_``).

Every field below is ``LAD_<FIELD NAME IN CAPITALS>``; e.g. ``LAD_MODEL``, ``LAD_STORE_URL``,
``LAD_MAX_BATCH_SIZE``. A ``.env`` file in the working directory is read too. Lists
(``LAD_LAYERS``) accept JSON (``[10, 11]``), comma lists (``10,11``) or a range (``10-13``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.engine.answers import DEFAULT_COT_PROMPT

DEFAULT_STORE_URL = "var/profiles"
"""Embedded file store, relative to the working directory (``/app/var/profiles`` in the
container). ``memory://`` keeps profiles in the process only; ``redis://host:port/db``
shares them between replicas."""


class Settings(BaseSettings):
    """Configuration of one service replica (model, store, limits, batching, auth, method)."""

    model_config = SettingsConfigDict(
        env_prefix="LAD_", env_file=".env", extra="ignore", validate_default=True
    )

    # --- model --------------------------------------------------------------------------
    model: str = Field("demo", description='"demo" (bundled), a hub name or a local path')
    revision: str | None = Field(None, description="model revision (hub branch, tag, commit)")
    device: str = Field("auto", description='"auto" (cuda when available), "cpu", "cuda:0"...')
    dtype: str = Field("auto", description='"auto", "float32", "bfloat16", "float16"')
    torch_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads (unset: torch's default)"
    )
    prompt_variant: Literal["vanilla", "instruction"] = Field(
        "vanilla", description="prompt wording of DESIGN §2.6 (part of the profile fingerprint)"
    )
    max_pixels: int | None = Field(
        None, ge=1, description="pixel budget per image for the model's image processor "
        "(width x height after resizing; bounds the image tokens; unset: the model's own)"
    )
    min_pixels: int | None = Field(
        None, ge=1, description="least pixels per image for the model's image processor"
    )
    device_map: str | None = Field(
        None, description='transformers device_map, e.g. "auto" to spread a model over '
        "several GPUs (unset: the whole model on LAD_DEVICE)"
    )

    # --- calibration store ----------------------------------------------------------------
    store_url: str = Field(
        DEFAULT_STORE_URL, description='profile store: a directory, "file://...", '
        '"memory://" or "redis://host:port/db"'
    )
    keep_versions: int = Field(5, ge=1, description="versions kept per profile for rollback")
    store_poll_s: float = Field(
        5.0, gt=0, description="Redis: periodic full re-read (pub/sub covers changes at once)"
    )
    store_key_prefix: str = Field(
        "lad", min_length=1, description="Redis key prefix (several deployments in one Redis)"
    )

    # --- input limits ---------------------------------------------------------------------
    max_images: int = Field(12, ge=2, description="most candidate images per request")
    max_image_bytes: int = Field(8 * 1024 * 1024, ge=1, description="encoded size per image")
    max_image_pixels: int = Field(16_777_216, ge=1, description="width x height per image")
    max_query_chars: int = Field(2000, ge=1, description="longest query / caption")

    # --- execution ------------------------------------------------------------------------
    max_batch_size: int = Field(8, ge=1, description="most requests per forward pass")
    max_wait_ms: float = Field(5.0, ge=0, description="how long a batch waits to fill")
    max_queue: int = Field(64, ge=1, description="queued forward passes before answering 429")

    # --- auth -----------------------------------------------------------------------------
    retrieve_token: SecretStr | None = Field(
        None, description="bearer token for /v1/retrieve (unset: open)"
    )
    admin_token: SecretStr | None = Field(
        None, description="bearer token for calibrate, delete and rollback (unset: open); "
        "also accepted by /v1/retrieve"
    )

    # --- operations -----------------------------------------------------------------------
    log_format: Literal["json", "text"] = Field(
        "text", description="json: one JSON object per line (log collectors); text: for people"
    )
    drain_timeout_s: float = Field(
        20.0, ge=0, description="on SIGTERM, most seconds to finish in-flight requests"
    )
    overhead_sample_rate: float = Field(
        0.0, ge=0, le=1, description="fraction of batches also run without attention capture "
        "to measure the latency overhead of debiasing live (0: off; e.g. 0.01)"
    )

    # --- method ---------------------------------------------------------------------------
    fallback_to_vanilla: bool = Field(
        False, description="serve vanilla (debiased: false) instead of 409 when uncalibrated"
    )
    layers: Annotated[list[int] | None, NoDecode] = Field(
        None, description="candidate layers Λ (unset: round(0.58 L) .. L-1)"
    )
    top_k: int = Field(2, ge=1, description="K, layers kept in L*")
    tau: float = Field(5.0, gt=0, description="posterior sharpening temperature τ")
    posterior_variant: Literal["reference", "logmean"] = "reference"
    mixture: Literal["linear", "log"] = "linear"
    sink_guard: bool = Field(
        True, description="leave layers whose attention prior puts < 1e-6 on some position "
        "out of L* (DESIGN §2.4); off = exactly the reference math"
    )

    # --- prompt baselines of the evaluation (DESIGN §2.6) ----------------------------------
    cot_prompt: str = Field(
        DEFAULT_COT_PROMPT, description="text of the cot / self_consistency prompts; fields "
        "{n}, {range}, {noun}, {first}, {last}, {query}"
    )
    cot_max_new_tokens: int = Field(64, ge=1, description="longest reasoning + answer")

    # --- server ---------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="`lad serve` bind address")
    port: int = Field(8000, ge=0, le=65535, description="`lad serve` port")
    log_level: str = Field("info", description="uvicorn / logging level")

    @field_validator("layers", mode="before")
    @classmethod
    def _parse_layers(cls, value: Any) -> Any:
        """Accept "[10, 11]", "10,11" and "10-13" from the environment."""
        if not isinstance(value, str):
            return value
        text = value.strip()
        if not text:
            return None
        if text.startswith("["):
            text = text[1:-1] if text.endswith("]") else text[1:]
        if "-" in text and "," not in text:
            lo, _, hi = text.partition("-")
            start, stop = int(lo), int(hi)
            if stop < start:
                raise ValueError(f"layer range {value!r} is empty")
            return list(range(start, stop + 1))
        return [int(part) for part in text.split(",") if part.strip()]

    @field_validator("layers")
    @classmethod
    def _check_layers(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if not value or any(layer < 0 for layer in value) or len(set(value)) != len(value):
            raise ValueError("layers must be distinct non-negative decoder layer indices")
        return sorted(value)

    @field_validator("retrieve_token", "admin_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    def method_hyperparameters(self) -> dict[str, Any]:
        """The inference hyper-parameters recorded in every calibration profile."""
        return {
            "top_k": self.top_k,
            "tau": self.tau,
            "posterior_variant": self.posterior_variant,
            "mixture": self.mixture,
            "sink_guard": self.sink_guard,
            "prompt_variant": self.prompt_variant,
        }
