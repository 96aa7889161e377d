"""The calls of the API, shared by both clients (they differ only in how they send).

Each call takes its HTTP method, path and token from the one route table
(``lad_client.routes``, the server's too); the retry policy (``Api.attempts``) is written
once, without I/O, as a generator both clients drive.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import httpx
from pydantic import BaseModel

from lad_client.retry import (
    RETRY_STATUSES,
    RetryPolicy,
    connection_error,
    error_of,
    retry_after_s,
)
from lad_client.routes import BY_NAME, Route
from lad_client.types import (
    CalibrateResponse,
    FeedbackResponse,
    ModelList,
    ProfileDeleted,
    ProfileList,
    ProfileRolledBack,
    ProfileSummary,
    RefreshResponse,
    RerankResponse,
    RetrieveResponse,
)

if TYPE_CHECKING:  # Pillow is an extra (lad-client[pillow]): bytes and paths need none
    from PIL import Image

ImageLike: TypeAlias = "Image.Image | bytes | str | PathLike[str]"
Example: TypeAlias = "tuple[str, Sequence[ImageLike], int]"
"""(query, images, answer): answer is the 0-based index of the matching image."""


def encode_image(image: ImageLike) -> str:
    """Base64 of the encoded image: bytes as they are, a path's bytes, a PIL image as PNG
    (lossless). A PIL image comes with Pillow installed, so Pillow is never imported here."""
    if isinstance(image, bytes | bytearray):
        raw = bytes(image)
    elif isinstance(image, str | PathLike):
        raw = Path(image).read_bytes()
    elif callable(getattr(image, "save", None)):  # a PIL image
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        raw = buffer.getvalue()
    else:
        raise TypeError(
            f"an image is encoded bytes, a file path or a PIL image, not {type(image).__name__}"
        )
    return base64.b64encode(raw).decode("ascii")


def _labels(labels: str | Sequence[str]) -> str | list[str]:
    return labels if isinstance(labels, str) else list(labels)


@dataclass(frozen=True)
class Call:
    """One API call: which route, what to send and what model the answer is."""

    route: Route
    model: type[BaseModel]
    path_params: dict[str, str] | None = None
    json: dict[str, Any] | None = None
    params: dict[str, Any] | None = None

    @classmethod
    def to(cls, name: str, model: type[BaseModel], **kwargs: Any) -> Call:
        return cls(BY_NAME[name], model, **kwargs)

    @property
    def url(self) -> str:
        return self.route.path.format(**(self.path_params or {}))


class Api:
    """The calls of the API and the retry policy; no I/O."""

    def __init__(self, token: str | None, admin_token: str | None, retry: RetryPolicy) -> None:
        self._token, self._admin_token, self.retry = token, admin_token, retry

    def headers(self, call: Call, request_id: str | None) -> dict[str, str]:
        tokens = (self._token, self._admin_token)
        first, second = tokens[::-1] if call.route.auth == "admin" else tokens
        token = first or second
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if request_id:
            headers["X-Request-ID"] = request_id
        return headers

    def attempts(self, call: Call, request_id: str | None) -> Generator[Any, Any, Any]:
        """The retry policy, written once for both clients (no I/O here): yields the
        ``request`` arguments of an attempt and receives its response (or has the
        connection error thrown in), yields a float to wait that many seconds, and
        returns the parsed answer or raises."""
        request = {
            "method": call.route.method,
            "url": call.url,
            "json": call.json,
            "params": call.params,
            "headers": self.headers(call, request_id),
        }
        for attempt in range(self.retry.retries + 1):
            last = attempt == self.retry.retries
            try:
                response = yield request
            except httpx.TransportError as exc:  # only a refused connection is sent again
                if last or not isinstance(exc, httpx.ConnectError):
                    raise connection_error(exc, call.route.method, call.url) from exc
                yield self.retry.wait_s(attempt, None)
                continue
            if last or response.status_code not in RETRY_STATUSES:
                return self.result(call, response)
            yield self.retry.wait_s(attempt, retry_after_s(response))
        raise AssertionError("unreachable: the last attempt returns or raises")

    @staticmethod
    def result(call: Call, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise error_of(response)
        return call.model.model_validate(response.json())

    @staticmethod
    def retrieve(
        query: str,
        images: Sequence[ImageLike],
        method: str,
        profile: str,
        labels: str | Sequence[str],
        return_details: bool,
    ) -> Call:
        body = {
            "query": query,
            "images": [encode_image(im) for im in images],
            "method": method,
            "profile": profile,
            "labels": _labels(labels),
            "return_details": return_details,
        }
        return Call.to("retrieve", RetrieveResponse, json=body)

    @staticmethod
    def rerank(
        query: str, images: Sequence[ImageLike], top_n: int | None, options: dict[str, Any]
    ) -> Call:
        body = {
            "query": query,
            "documents": [encode_image(im) for im in images],
            "top_n": top_n,
            **{k: v for k, v in options.items() if v is not None},
        }
        return Call.to("rerank", RerankResponse, json=body)

    @staticmethod
    def calibrate(
        examples: Sequence[Example],
        profile: str,
        labels: str | Sequence[str],
        n: Sequence[int] | str | None = None,
    ) -> Call:
        body = {
            "profile": profile,
            "labels": _labels(labels),
            **({} if n is None else {"n": n if isinstance(n, str) else list(n)}),
            "examples": [
                {"query": q, "images": [encode_image(im) for im in ims], "answer": int(answer)}
                for q, ims, answer in examples
            ],
        }
        return Call.to("calibrate", CalibrateResponse, json=body)

    @staticmethod
    def models() -> Call:
        return Call.to("list_models", ModelList)

    @staticmethod
    def profiles(name: str | None) -> Call:
        if name is None:
            return Call.to("list_profiles", ProfileList)
        return Call.to("get_profile", ProfileSummary, path_params={"name": name})

    @staticmethod
    def rollback(name: str, n: int, labels: str, version: int | None) -> Call:
        params: dict[str, Any] = {"n": n, "labels": labels}
        if version is not None:
            params["version"] = version
        return Call.to(
            "rollback_profile", ProfileRolledBack, path_params={"name": name}, params=params
        )

    @staticmethod
    def feedback(request_id: str, answer: int) -> Call:
        body = {"request_id": request_id, "answer": int(answer)}
        return Call.to("feedback", FeedbackResponse, json=body)

    @staticmethod
    def refresh(name: str, n: int, labels: str, force: bool) -> Call:
        return Call.to(
            "refresh_profile",
            RefreshResponse,
            path_params={"name": name},
            params={"n": n, "labels": labels, "force": force},
        )

    @staticmethod
    def delete(name: str, n: int, labels: str) -> Call:
        return Call.to(
            "delete_profile",
            ProfileDeleted,
            path_params={"name": name},
            params={"n": n, "labels": labels},
        )
