"""Whether a hub name can be loaded, known at once; the hub libraries' lines in the log once.

Without this, a hub name that is not in the cache, with the hub out of reach, costs
huggingface_hub's five retries (1 + 2 + 4 + 8 + 8 s) per file before the load fails, and a
cached model costs them for every optional file the processor looks for. So before the
first file is asked for: a name in the cache loads from the cache alone when one short
probe finds the hub unreachable (as with ``HF_HUB_OFFLINE=1``), and a name that is not in
the cache fails at once when the hub is offline or unreachable.

huggingface_hub puts its own stderr handler on its logger and lets the records propagate
too, so under the service's log every hub warning printed twice; transformers writes
through its own handler, outside the service's format. Both go through the service's
handler alone once it has one.
"""

from __future__ import annotations

import logging

import httpx
import huggingface_hub
import transformers

log = logging.getLogger("lad.model")

PROBE_TIMEOUT_S = 3.0
"""Longest wait for the hub's answer before it counts as unreachable (one try, no retry)."""


def log_once() -> None:
    """The hub libraries' records through the root logger's handlers only, when there are
    any (``lad serve`` configured them); otherwise the libraries keep their own."""
    if not logging.getLogger().handlers:
        return
    logging.getLogger("huggingface_hub").handlers.clear()
    transformers.utils.logging.disable_default_handler()
    transformers.utils.logging.enable_propagation()


def _is_cached(name: str, revision: str | None) -> bool:
    found = huggingface_hub.try_to_load_from_cache(name, "config.json", revision=revision)
    return isinstance(found, str)


def _probe() -> Exception | None:
    """None when the hub answers at all (any status), else why it did not."""
    try:
        httpx.head(huggingface_hub.constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)
    except httpx.TransportError as exc:
        return exc
    return None


def unavailable(name: str, revision: str | None) -> Exception | None:
    """Why the hub name ``name`` cannot be loaded, found at once (None: load it).

    Offline (``HF_HUB_OFFLINE``) or unreachable and not in the cache: the cause. Unreachable
    but cached: None, and the rest of the load reads the cache only."""
    cached = _is_cached(name, revision)
    if huggingface_hub.constants.is_offline_mode():
        return None if cached else OSError(f"HF_HUB_OFFLINE is set and {name} is not cached")
    cause = _probe()
    if cause is None:
        return None
    if not cached:
        return cause
    log.warning(
        "the hub at %s cannot be reached (%s: %s): loading %s from the cache only",
        huggingface_hub.constants.ENDPOINT,
        type(cause).__name__,
        cause,
        name,
    )
    huggingface_hub.constants.HF_HUB_OFFLINE = True  # what HF_HUB_OFFLINE=1 would have set
    return None
