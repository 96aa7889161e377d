"""lad-client: the Python client of lad-serve (position-debiased multi-image retrieval).

A light package (httpx, pydantic, pillow): no torch, no model. The service itself imports
its wire schemas (``lad_client.types``) and vocabulary (``lad_client.vocabulary``) from here,
so client and server agree on every field.

    from lad_client import LadClient

    with LadClient("http://127.0.0.1:8000") as lad:
        answer = lad.retrieve("a red circle", ["a.jpg", "b.jpg", "c.jpg"])
        answer.index  # 0-based index into the images
"""

from lad_client.calls import ROUTES, Example, ImageLike, Route, encode_image
from lad_client.client import AsyncLadClient, LadClient
from lad_client.retry import RETRY_STATUSES, LadError, RetryPolicy, error_of, retry_after_s

__all__ = [
    "RETRY_STATUSES",
    "ROUTES",
    "AsyncLadClient",
    "Example",
    "ImageLike",
    "LadClient",
    "LadError",
    "RetryPolicy",
    "Route",
    "encode_image",
    "error_of",
    "retry_after_s",
]
