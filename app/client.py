"""A small Python client for the service, for retrieval back-ends that embed it.

Images may be PIL images, encoded bytes or file paths; they travel as base64 JSON. Errors
come back as :class:`LadError` carrying the service's ``code`` and ``message``, so a caller
can branch on ``calibration_required`` or ``overloaded`` (with ``retry_after_s``).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

ImageLike = Image.Image | bytes | str | PathLike[str]


class LadError(RuntimeError):
    """An error answer of the service: HTTP status, error code and message."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: float | None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.retry_after_s = (
            status, code, message, retry_after_s,
        )  # fmt: skip


def encode_image(image: ImageLike) -> str:
    """Base64 of the encoded image (PIL images are sent as PNG, lossless)."""
    if isinstance(image, Image.Image):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        raw = buffer.getvalue()
    elif isinstance(image, bytes):
        raw = image
    else:
        raw = Path(image).read_bytes()
    return base64.b64encode(raw).decode("ascii")


class LadClient:
    """Synchronous client; pass ``http`` to reuse an existing ``httpx.Client``."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        token: str | None = None,
        admin_token: str | None = None,
        timeout: float = 120.0,
        http: httpx.Client | None = None,
    ) -> None:
        self._http = http or httpx.Client(base_url=base_url, timeout=timeout)
        self._owns_http = http is None
        self._token, self._admin_token = token, admin_token

    def __enter__(self) -> LadClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def _request(self, verb: str, path: str, *, admin: bool = False, **kwargs: Any) -> Any:
        token = (self._admin_token or self._token) if admin else (self._token or self._admin_token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = self._http.request(verb, path, headers=headers, **kwargs)
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                code, message = error["code"], error["message"]
            except (ValueError, KeyError, TypeError):
                code, message = "http_error", response.text[:500]
            retry = response.headers.get("Retry-After")
            raise LadError(response.status_code, code, message, float(retry) if retry else None)
        return response.json()

    def retrieve(
        self,
        query: str,
        images: Sequence[ImageLike],
        *,
        method: str = "agd",
        profile: str = "default",
        labels: str | Sequence[str] = "digits",
        return_details: bool = False,
    ) -> dict[str, Any]:
        """The service's answer: ``index`` (0-based), ``probabilities``, ``timings_ms``..."""
        body = {
            "query": query,
            "images": [encode_image(im) for im in images],
            "method": method,
            "profile": profile,
            "labels": labels if isinstance(labels, str) else list(labels),
            "return_details": return_details,
        }
        return self._request("POST", "/v1/retrieve", json=body)

    def calibrate(
        self,
        examples: Sequence[tuple[str, Sequence[ImageLike], int]],
        *,
        profile: str = "default",
        labels: str | Sequence[str] = "digits",
    ) -> dict[str, Any]:
        """Calibrate from (query, images, 0-based answer) examples sharing one N."""
        body = {
            "profile": profile,
            "labels": labels if isinstance(labels, str) else list(labels),
            "examples": [
                {"query": q, "images": [encode_image(im) for im in ims], "answer": int(answer)}
                for q, ims, answer in examples
            ],
        }
        return self._request("POST", "/v1/calibrate", admin=True, json=body)

    def profiles(self, name: str | None = None) -> dict[str, Any]:
        return self._request("GET", "/v1/profiles" + (f"/{name}" if name else ""))

    def rollback(self, name: str, n: int, labels: str = "digits") -> dict[str, Any]:
        params = {"n": n, "labels": labels}
        return self._request("POST", f"/v1/profiles/{name}/rollback", admin=True, params=params)

    def delete(self, name: str, n: int, labels: str = "digits") -> dict[str, Any]:
        params = {"n": n, "labels": labels}
        return self._request("DELETE", f"/v1/profiles/{name}", admin=True, params=params)

    def ready(self) -> dict[str, Any]:
        return self._request("GET", "/readyz")
