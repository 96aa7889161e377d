"""`open_store(url)`: one entry point that picks the backend from the URL scheme (and
`open_online_store(url)`, the online calibration state beside it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from calibration_store.base import DEFAULT_KEEP_VERSIONS, ProfileStore
from calibration_store.evidence import MemoryOnlineStore, OnlineStore
from calibration_store.local import FileProfileStore, MemoryProfileStore


def open_store(
    url: str | Path,
    *,
    keep_versions: int = DEFAULT_KEEP_VERSIONS,
    key_prefix: str = "lad",
    poll_interval: float = 5.0,
    socket_timeout: float = 2.0,
    listen: bool = True,
    **redis_options: Any,
) -> ProfileStore:
    """Open a profile store.

    - "memory://"                 a fresh in-process store (tests)
    - "/path/dir", "rel/dir",
      "file:///abs/dir"           the embedded file store (the default)
    - "redis://host:port/db",
      "rediss://..."              the shared Redis store; key_prefix, poll_interval,
                                  socket_timeout and listen only apply here
    Anything else raises ValueError.
    """
    text = str(url).strip()
    if not text:
        raise ValueError("empty profile store URL")
    if "://" not in text:
        return FileProfileStore(text, keep_versions=keep_versions)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "memory":
        return MemoryProfileStore(keep_versions=keep_versions)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file store URL must be local (file:///abs/path), got {text!r}")
        if not parts.path:
            raise ValueError(f"file store URL without a path: {text!r}")
        return FileProfileStore(unquote(parts.path), keep_versions=keep_versions)
    if scheme in ("redis", "rediss"):
        from calibration_store.redis_store import RedisProfileStore  # redis is an optional extra

        return RedisProfileStore(
            text,
            keep_versions=keep_versions,
            key_prefix=key_prefix,
            poll_interval=poll_interval,
            socket_timeout=socket_timeout,
            listen=listen,
            **redis_options,
        )
    raise ValueError(
        f"unknown profile store scheme {parts.scheme!r} in {text!r}; "
        "use memory://, a directory path, file:///abs/dir or redis://host:port/db"
    )


def open_online_store(
    url: str | Path,
    *,
    key_prefix: str = "lad",
    ttl_s: float = 900.0,
    max_entries: int = 100_000,
    socket_timeout: float = 2.0,
) -> OnlineStore:
    """The evidence cache and feedback statistics beside the profiles of ``url``: in
    process for memory:// (and for a directory, with the statistics persisted in it as
    ``online/state.json``: a subfolder, so the profile store never reads it as a profile),
    in Redis for redis:// (shared by every replica)."""
    text = str(url).strip()
    parts = urlsplit(text)
    scheme = parts.scheme.lower() if "://" in text else ""
    if scheme in ("redis", "rediss"):
        from calibration_store.redis_online import RedisOnlineStore

        return RedisOnlineStore(
            text,
            key_prefix=key_prefix,
            ttl_s=ttl_s,
            max_entries=max_entries,
            socket_timeout=socket_timeout,
        )
    if scheme == "memory":
        return MemoryOnlineStore(ttl_s=ttl_s, max_entries=max_entries)
    root = Path(unquote(parts.path) if scheme == "file" else text)
    return MemoryOnlineStore(
        ttl_s=ttl_s, max_entries=max_entries, path=root / "online" / "state.json"
    )
