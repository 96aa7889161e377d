"""lad-client: the Python client of lad-serve (position-debiased multi-image retrieval).

A light package (httpx and pydantic; Pillow only to send PIL images, the ``pillow`` extra):
no torch, no model. The service itself imports
its wire schemas (``lad_client.types``) and vocabulary (``lad_client.vocabulary``) from here,
so client and server agree on every field.

    from lad_client import LadClient

    with LadClient("http://127.0.0.1:8000") as lad:
        answer = lad.retrieve("a red circle", ["a.jpg", "b.jpg", "c.jpg"])
        answer.index  # 0-based index into the images
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
"""The package's version (pyproject.toml reads it from here)."""

if TYPE_CHECKING:
    from lad_client.calls import Example, ImageLike, encode_image
    from lad_client.client import AsyncLadClient, LadClient
    from lad_client.retry import (
        RETRY_STATUSES,
        LadConnectionError,
        LadError,
        RetryPolicy,
        error_of,
        retry_after_s,
    )
    from lad_client.routes import ROUTES, Route

_HOMES = {
    "lad_client.calls": ("Example", "ImageLike", "encode_image"),
    "lad_client.client": ("AsyncLadClient", "LadClient"),
    "lad_client.retry": (
        "RETRY_STATUSES",
        "LadConnectionError",
        "LadError",
        "RetryPolicy",
        "error_of",
        "retry_after_s",
    ),
    "lad_client.routes": ("ROUTES", "Route"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    """The client is imported on first use (PEP 562): the server's lowest layers import
    ``lad_client.vocabulary``, which should not load httpx and every wire model."""
    if name not in _HOME_OF:
        raise AttributeError(f"module 'lad_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME_OF[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "RETRY_STATUSES",
    "ROUTES",
    "AsyncLadClient",
    "Example",
    "ImageLike",
    "LadClient",
    "LadConnectionError",
    "LadError",
    "RetryPolicy",
    "Route",
    "__version__",
    "encode_image",
    "error_of",
    "retry_after_s",
]
