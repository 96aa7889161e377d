"""Service settings: the one place that reads the environment (prefix ``LAD_``).

Six parts, each a pydantic-settings class of its own that reads its fields from the
environment (server, model, limits, store, online, method; ``PARTS``); ``Settings`` is all of
them, what the app, ``lad serve`` and the tests build (a module that needs one part can
take that part's class as its type, as the form reader takes LimitsSettings). Every field is
``LAD_<FIELD NAME IN CAPITALS>`` whatever its part; e.g. ``LAD_MODEL``, ``LAD_STORE_URL``,
``LAD_MAX_BATCH_SIZE``. A ``.env`` file in the working directory is read too. Lists
(``LAD_LAYERS``) accept JSON (``[10, 11]``), comma lists (``10,11``) or a range (``10-13``).
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.method.methods import MethodConfig
from lad_client.vocabulary import MAX_N

DEFAULT_STORE_URL = "var/profiles"
ALLOWED_IMAGE_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
"""Pillow formats the decoder may be allowed to open; nothing else is ever tried."""
DEFAULT_IMAGE_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""Embedded file store, relative to the working directory (``/app/var/profiles`` in the
container). ``memory://`` keeps profiles in the process only; ``redis://host:port/db``
shares them between replicas."""
SERVED_NAME_PATTERN = r"^\S+$"
"""A served model name: any characters but spaces (a hub id, "name:v2", a former path)."""

_HOST = re.compile(
    r"(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*"
)
"""A DNS host name (letters, digits, hyphens, underscores; labels of 1-63 characters)."""


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _env_list(value: Any) -> Any:
    """A list setting as the environment gives it ("a,b" or a JSON list), its entries
    stripped and blank ones dropped; anything else as it is (the field's type checks it)."""
    if isinstance(value, str):
        text = value.strip()
        value = json.loads(text) if text.startswith("[") else text.split(",")
    if isinstance(value, list | tuple):
        value = [str(v).strip() for v in value if str(v).strip()]
    return value


ENVIRONMENT = SettingsConfigDict(
    env_prefix="LAD_", env_file=".env", extra="ignore", validate_default=True
)
"""How every part reads its fields: ``LAD_<FIELD>`` from the environment, then ``.env``."""


class ServerSettings(BaseSettings):
    """The HTTP server: bind address, connections, timeouts, tokens, logs, shutdown."""

    model_config = ENVIRONMENT

    host: str = Field("127.0.0.1", description="`lad serve` bind address")
    port: int = Field(8000, ge=0, le=65535, description="`lad serve` port")
    log_level: str = Field("info", description="uvicorn / logging level")
    allow_open_admin: bool = Field(
        False,
        description="let `lad serve` bind a non-loopback address without "
        "LAD_ADMIN_TOKEN (calibrate, delete and rollback then open to anyone who reaches it)",
    )
    read_timeout_s: float = Field(
        30.0, gt=0, description="most seconds to receive a request body (then 408)"
    )
    min_transfer_bytes_per_s: int = Field(
        256 * 1024,
        ge=0,
        description="slowest average rate of a request body, and of an answer the client "
        "reads, after LAD_TRANSFER_GRACE_S (then 408, or the connection closed; 0: no minimum)",
    )
    transfer_grace_s: float = Field(
        3.0,
        gt=0,
        description="seconds a body or an answer may take before its minimum rate applies",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="most seconds to receive a request's headers (then close)"
    )
    keep_alive_s: float = Field(5.0, gt=0, description="idle keep-alive connection lifetime")
    max_connections: int = Field(
        1024,
        ge=1,
        description="open connections; past it the longest-idle one (no request "
        "under way) is closed to make room, else the longest-stalled upload",
    )
    max_in_flight: int = Field(
        256,
        ge=1,
        description="requests handled at once, counted once their body has arrived "
        "(not the probes, /metrics); past it 429 `overloaded`",
    )

    retrieve_token: SecretStr | None = Field(
        None, description="bearer token for /v1/retrieve (unset: open)"
    )
    admin_token: SecretStr | None = Field(
        None,
        description="bearer token for calibrate, delete and rollback (unset: open); "
        "also accepted by /v1/retrieve",
    )

    min_admin_token_chars: int = Field(
        16,
        ge=1,
        description="shortest LAD_ADMIN_TOKEN `lad serve` accepts on a non-loopback bind "
        "(a shorter one is refused at start, like a missing one)",
    )

    log_format: Literal["json", "text"] = Field(
        "text", description="json: one JSON object per line (log collectors); text: for people"
    )
    drain_timeout_s: float = Field(
        20.0, ge=0, description="on SIGTERM, most seconds to finish in-flight requests"
    )

    @field_validator("retrieve_token", "admin_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    def binds_loopback_only(self) -> bool:
        """Whether `host` is a loopback address (only this machine can connect)."""
        if self.host.strip("[]").lower() in LOOPBACK_HOSTS:
            return True
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:  # a host name other than localhost
            return False

    def exposure_problem(self) -> str | None:
        """Why `lad serve` must not start with these settings (None: it may).

        Calibrate, delete and rollback change what every client gets; without a token
        they are open to anyone who can reach the port, so a non-loopback bind needs
        LAD_ADMIN_TOKEN (of at least LAD_MIN_ADMIN_TOKEN_CHARS characters: a short one is
        guessed) or the explicit opt-out LAD_ALLOW_OPEN_ADMIN=true.
        """
        if self.binds_loopback_only():
            return None
        token = self.admin_token.get_secret_value() if self.admin_token is not None else None
        if token is not None and len(token) < self.min_admin_token_chars:
            return (
                f"refusing to listen on {self.host} with a LAD_ADMIN_TOKEN of {len(token)} "
                f"characters: at least LAD_MIN_ADMIN_TOKEN_CHARS={self.min_admin_token_chars} "
                "are needed where others can reach the port (e.g. `openssl rand -hex 24`)"
            )
        if token is not None or self.allow_open_admin:
            return None
        return (
            f"refusing to listen on {self.host} without LAD_ADMIN_TOKEN: calibrate, delete and "
            "rollback would be open to anyone who reaches this port. Set LAD_ADMIN_TOKEN, "
            "bind 127.0.0.1, or set LAD_ALLOW_OPEN_ADMIN=true to accept that."
        )


class ModelSettings(BaseSettings):
    """The served model and how it runs: checkpoint, device, image budget, caches, batching."""

    model_config = ENVIRONMENT

    model: str = Field("demo", description='"demo" (bundled), a hub name or a local path')
    revision: str | None = Field(None, description="model revision (hub branch, tag, commit)")
    served_model_name: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=SERVED_NAME_PATTERN,
        description="the name the model is served under: GET /v1/models, a rerank's `model`, "
        "the metrics' model label, and the key of its profiles (so a moved checkpoint keeps "
        "them); unset: the hub id as given, or a local directory's own name",
    )
    device: str = Field("auto", description='"auto" (cuda when available), "cpu", "cuda:0"...')
    dtype: str = Field("auto", description='"auto", "float32", "bfloat16", "float16"')
    torch_threads: int | None = Field(
        None,
        ge=0,
        description="torch intra-op threads on CPU; unset: the usable CPUs (affinity and "
        "cgroup quota) minus one, at least 1, leaving a core to the HTTP loop and image "
        "decode; 0: torch's own default (every core)",
    )
    max_pixels: int | None = Field(
        None,
        ge=1,
        description="pixel budget per image for the model's image processor "
        "(width x height after resizing; bounds the image tokens; unset: the model's own)",
    )
    min_pixels: int | None = Field(
        None, ge=1, description="least pixels per image for the model's image processor"
    )
    device_map: str | None = Field(
        None,
        description='transformers device_map, e.g. "auto" to spread a model over '
        "several GPUs (unset: the whole model on LAD_DEVICE)",
    )
    encoder_cache_mb: float = Field(
        256,
        ge=0,
        description="bound of the encoder cache (image embeddings by content, shared by the "
        "replica's requests; docs/benchmarks.md), in MiB; 0 turns it off",
    )
    host_memory_retain_s: float = Field(
        1.0,
        ge=0,
        le=3600,
        description="glibc: memory a forward frees is kept for the next one (no page faults "
        "on large tensors) until the model worker has been idle this many seconds, then "
        "given back to the OS; 0: blocks of 1 MiB or more are mapped apart and returned when "
        "freed (docs/benchmarks.md)",
    )
    host_memory_trim_every_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="with retention: a busy model worker (never idle) still gives freed "
        "memory back after a batch once this many seconds (and 8 batches) have passed since "
        "the last release",
    )
    host_memory_trim_above_mb: float = Field(
        1024,
        gt=0,
        description="with retention: give freed memory back after any batch that leaves "
        "resident memory this many MiB above where the last release left it (keep it above "
        "one forward's working set, or every batch releases)",
    )
    trust_remote_code: bool = Field(
        False,
        description="run the Python code a checkpoint ships (model families outside "
        "transformers, e.g. LLaVA-OneVision-1.5); off by default, logged as a warning when on",
    )

    # --- execution ---------------------------------------------------------------------
    max_batch_size: int = Field(8, ge=1, description="most requests per forward pass")
    max_wait_ms: float = Field(
        0.0, ge=0, description="extra wait of a partial batch for more requests (0: none)"
    )
    max_queue: int = Field(64, ge=1, description="queued forward passes before answering 429")
    overhead_sample_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="fraction of batches also run without attention capture "
        "to measure the latency overhead of debiasing live (0: off; e.g. 0.01)",
    )


class LimitsSettings(BaseSettings):
    """Input limits (docs/api.md, Limits and errors): what one request may carry."""

    model_config = ENVIRONMENT

    max_images: int = Field(12, ge=2, le=MAX_N, description="most candidate images per request")
    max_rerank_candidates: int = Field(
        256,
        ge=2,
        le=10_000,
        description="most documents per /v1/rerank request (above the largest window they go "
        "through the windowed tournament; their pixels are decoded a batch of windows at a "
        "time, so memory grows with their bytes, within LAD_MAX_BODY_BYTES, not their number)",
    )
    max_rerank_passes: int = Field(
        256,
        ge=1,
        description="most forward passes one /v1/rerank may plan (its tournament's "
        "cost is known before it runs: windows, or N per window for perm_avg)",
    )
    max_image_bytes: int = Field(8 * 1024 * 1024, ge=1, description="encoded size per image")
    max_image_pixels: int = Field(
        16_777_216,
        ge=1,
        description="width x height per image, read from its header "
        "before decoding (the decompression-bomb guard)",
    )
    max_request_pixels: int = Field(
        201_326_592,
        ge=1,
        description="decoded pixels per request, all images together, "
        "after JPEG draft reduction (default: twelve 4096 x 4096 images); /v1/rerank: the "
        "images of one batch of windows, which it decodes at once",
    )
    max_aspect_ratio: float = Field(
        100.0,
        ge=1,
        lt=200,
        description="longest over shortest side of an image; beyond it "
        "an image is refused (the image processors cannot take >= 200)",
    )
    image_formats: Annotated[list[str], NoDecode] = Field(
        list(DEFAULT_IMAGE_FORMATS),
        description=f"accepted image formats, a subset of "
        f"{', '.join(ALLOWED_IMAGE_FORMATS)}; anything else is refused with 415",
    )
    max_inflight_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024 * 1024,
        description="bytes all requests in flight may hold together: bodies (3 x their size), "
        "decoded pixels and answers until written; past it a request waits, then 429 "
        "`overloaded`",
    )
    max_concurrent_decodes: int = Field(
        2, ge=1, description="requests decoding images at once (bounds decode memory)"
    )
    decode_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="threads decoding images at once, shared by all requests "
        "(Pillow decodes without the GIL); each holds one full-size image at a time",
    )
    # --- image URLs (docs/api.md "Images by URL"; off by default) -------------------------
    media_allowed_domains: Annotated[list[str], NoDecode] = Field(
        [],
        description="hosts whose http(s) image URLs are fetched, a comma or JSON list: "
        "`cdn.example.com` (that host), `*.example.com` (every name under it); empty: no URL "
        "is fetched (400 `media_not_allowed`)",
    )
    media_allowed_networks: Annotated[list[str], NoDecode] = Field(
        [],
        description="address ranges (CIDR) an allowed host may resolve to although they are "
        "private, loopback, link-local or otherwise not public (e.g. `10.0.0.0/8` for an "
        "internal object store); empty: public addresses only",
    )
    media_timeout_s: float = Field(
        10.0, gt=0, le=300, description="longest fetch of one image URL, redirects included"
    )
    media_max_redirects: int = Field(
        3, ge=0, le=20, description="redirects followed per image URL (each hop re-checked)"
    )
    media_concurrency: int = Field(
        16, ge=1, le=1024, description="image URL fetches in flight at once on the replica"
    )
    max_query_chars: int = Field(2000, ge=1, description="longest query / caption")
    max_label_chars: int = Field(32, ge=1, description="longest single label")
    max_label_tokens: int = Field(
        256, ge=1, description="tokens of all N labels together, as the model tokenises them"
    )
    max_body_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="request body of /v1/retrieve and /v1/rerank, "
        "counted as it arrives (chunked too)",
    )
    max_calibrate_body_bytes: int = Field(
        128 * 1024 * 1024, ge=1024, description="request body of /v1/calibrate"
    )

    @field_validator("image_formats", mode="before")
    @classmethod
    def _parse_formats(cls, value: Any) -> Any:
        """Accept "JPEG,PNG" and a JSON list from the environment; names are upper-cased."""
        value = _env_list(value)
        return [v.upper() for v in value] if isinstance(value, list) else value

    @field_validator("image_formats")
    @classmethod
    def _check_formats(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(ALLOWED_IMAGE_FORMATS))
        if unknown or not value:
            raise ValueError(
                f"image_formats must be a non-empty subset of {ALLOWED_IMAGE_FORMATS}; "
                f"unknown: {unknown}"
            )
        return list(dict.fromkeys(value))

    @field_validator("media_allowed_domains", "media_allowed_networks", mode="before")
    @classmethod
    def _parse_media_lists(cls, value: Any) -> Any:
        """Accept "a.com,b.com" and a JSON list from the environment."""
        return _env_list(value)

    @field_validator("media_allowed_domains")
    @classmethod
    def _check_media_domains(cls, value: list[str]) -> list[str]:
        """Host names, IP addresses or ``*.<domain>``, as compared: lower case, no trailing
        dot, no IPv6 brackets (a URL, a port or a bare ``*`` is a configuration error)."""
        hosts = []
        for entry in value:
            host = entry.strip().strip("[]").rstrip(".").lower()
            name = host.removeprefix("*.")
            if not _HOST.fullmatch(name) and not _is_ip(name):
                raise ValueError(
                    f"media_allowed_domains entry {entry!r}: expected a host name, an IP "
                    "address or '*.<domain>' (no scheme, port or path)"
                )
            hosts.append(host)
        return list(dict.fromkeys(hosts))

    @field_validator("media_allowed_networks")
    @classmethod
    def _check_media_networks(cls, value: list[str]) -> list[str]:
        try:
            return [str(ipaddress.ip_network(v, strict=False)) for v in value]
        except ValueError as exc:
            raise ValueError(f"media_allowed_networks: {exc} (expected CIDR ranges)") from None


class StoreSettings(BaseSettings):
    """The calibration store: where profiles live and how many versions are kept."""

    model_config = ENVIRONMENT

    store_url: str = Field(
        DEFAULT_STORE_URL,
        description='profile store: a directory, "file://...", '
        '"memory://" or "redis://host:port/db"',
    )
    keep_versions: int = Field(5, ge=1, description="versions kept per profile for rollback")
    store_poll_s: float = Field(
        5.0, gt=0, description="Redis: periodic full re-read (pub/sub covers changes at once)"
    )
    store_key_prefix: str = Field(
        "lad", min_length=1, description="Redis key prefix (several deployments in one Redis)"
    )


class OnlineSettings(BaseSettings):
    """Online calibration (docs/calibration.md): evidence, feedback and refresh."""

    model_config = ENVIRONMENT

    evidence_ttl_s: float = Field(
        900.0,
        gt=0,
        description="how long a retrieval's evidence (scores, attention) waits "
        "for POST /v1/feedback",
    )
    evidence_max_entries: int = Field(
        100_000, ge=1, description="most evidence entries kept (oldest dropped first)"
    )
    feedback_min_row_count: int = Field(
        20, ge=1, description="feedback instances a row of L_obs needs before refresh uses it"
    )
    refresh_min_holdout: int = Field(
        20, ge=1, description="held-out feedback a refresh needs to be judged (else candidate)"
    )
    feedback_refresh_every: int = Field(
        0, ge=0, description="refresh automatically after this much new feedback (0: off)"
    )
    refresh_prior: Literal["feedback", "served"] = Field(
        "feedback",
        description="refresh's prior P from the labelled feedback, or from every "
        "served request (P needs no labels)",
    )


class MethodSettings(BaseSettings):
    """The method's knobs (DESIGN §2.4) and the prompt wording; the hyper-parameters are
    ``MethodConfig``'s, built by :meth:`method_config`."""

    model_config = ENVIRONMENT

    prompt_variant: Literal["vanilla", "instruction"] = Field(
        "vanilla", description="prompt wording of DESIGN §2.6 (part of the profile fingerprint)"
    )
    fallback_to_vanilla: bool = Field(
        False, description="serve vanilla (debiased: false) instead of 409 when uncalibrated"
    )
    layers: Annotated[list[int] | None, NoDecode] = Field(
        None,
        description="candidate layers Λ (unset: round(0.58 L) .. L-1, of the layers with "
        "softmax attention)",
    )
    top_k: int = Field(MethodConfig.top_k, ge=1, description="K, layers kept in L*")
    tau: float = Field(MethodConfig.tau, gt=0, description="posterior sharpening temperature τ")
    posterior_variant: Literal["reference", "logmean"] = MethodConfig.posterior_variant
    mixture: Literal["linear", "log"] = MethodConfig.mixture
    sink_guard: bool = Field(
        MethodConfig.sink_guard,
        description="leave layers whose attention prior puts < 1e-6 "
        "on some position out of L* (DESIGN §2.4); off = exactly the reference math",
    )

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

    def method_config(self) -> MethodConfig:
        """The inference hyper-parameters as the method takes them (the one definition)."""
        return MethodConfig(
            top_k=self.top_k,
            tau=self.tau,
            posterior_variant=self.posterior_variant,
            mixture=self.mixture,
            sink_guard=self.sink_guard,
        )


class Settings(
    ServerSettings, ModelSettings, LimitsSettings, StoreSettings, OnlineSettings, MethodSettings
):
    """Configuration of one service replica: every part, each field under its flat name
    (``settings.max_images``, env ``LAD_MAX_IMAGES``)."""

    model_config = ENVIRONMENT


PARTS: dict[str, type[BaseSettings]] = {
    "server": ServerSettings,
    "model": ModelSettings,
    "limits": LimitsSettings,
    "store": StoreSettings,
    "online": OnlineSettings,
    "method": MethodSettings,
}
"""The parts of the settings by name, in the order the configuration page lists them."""


def part_of(field: str) -> str:
    """The part a setting belongs to (``"limits"`` for ``max_images``)."""
    for name, part in PARTS.items():
        if field in part.model_fields:
            return name
    raise KeyError(field)
