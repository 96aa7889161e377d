"""Python clients of the service for retrieval back-ends: ``LadClient`` and ``AsyncLadClient``.

Both take images as PIL images, encoded bytes or file paths (sent as base64 JSON), return
the service's own response models (``app.schemas``: typed, validated), time out, and retry
what is worth retrying: 429 (queue full) and 503 (not ready, store down) with exponential
backoff that honours ``Retry-After``, and connections that could not be opened. Any other
error answer raises :class:`LadError` with the service's ``code`` and ``message``, so a
caller can branch on ``calibration_required``. Importing this module loads no torch.

    with LadClient("http://127.0.0.1:8000") as lad:
        answer = lad.retrieve("a red circle", ["a.jpg", "b.jpg", "c.jpg"])
        answer.index  # 0-based index into the images
"""

from __future__ import annotations

import asyncio
import base64
import io
import random
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

import httpx
from PIL import Image
from pydantic import BaseModel

from app.schemas import (
    CalibrateResponse,
    FeedbackResponse,
    ProfileDeleted,
    ProfileList,
    ProfileRolledBack,
    ProfileSummary,
    Readiness,
    RefreshResponse,
    RerankResponse,
    RetrieveResponse,
)

ImageLike = Image.Image | bytes | str | PathLike[str]
Example = tuple[str, Sequence[ImageLike], int]
"""(query, images, answer): answer is the 0-based index of the matching image."""
M = TypeVar("M", bound=BaseModel)
RETRY_STATUSES = frozenset({429, 503})


class LadError(RuntimeError):
    """An error answer of the service: HTTP status, error code, message, and when to retry."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: float | None = None,
                 request_id: str | None = None) -> None:  # fmt: skip
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.retry_after_s, self.request_id = retry_after_s, request_id


def encode_image(image: ImageLike) -> str:
    """Base64 of the encoded image (PIL images are sent as PNG, lossless)."""
    if isinstance(image, Image.Image):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        raw = buffer.getvalue()
    elif isinstance(image, bytes | bytearray):
        raw = bytes(image)
    else:
        raw = Path(image).read_bytes()
    return base64.b64encode(raw).decode("ascii")


def _labels(labels: str | Sequence[str]) -> str | list[str]:
    return labels if isinstance(labels, str) else list(labels)


def retry_after_s(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), None if absent."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def error_of(response: httpx.Response) -> LadError:
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "http_error", response.text[:500]
    return LadError(response.status_code, code, message, retry_after_s(response),
                    response.headers.get("X-Request-ID"))  # fmt: skip


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait: attempt k waits max(Retry-After, base * 2^k) plus up
    to 10 % jitter, at most ``max_wait_s``; ``retries`` = 0 turns retrying off."""

    retries: int = 3
    base_s: float = 0.5
    max_wait_s: float = 30.0

    def wait_s(self, attempt: int, retry_after: float | None) -> float:
        backoff = self.base_s * (2**attempt)
        wait = max(backoff, retry_after or 0.0)
        return min(self.max_wait_s, wait * (1 + 0.1 * random.random()))


@dataclass(frozen=True)
class _Call:
    """One API call: what to send and what model the answer is."""

    verb: str
    path: str
    model: type[BaseModel]
    admin: bool = False
    json: dict[str, Any] | None = None
    params: dict[str, Any] | None = None


class _Api:
    """The calls of the API, shared by both clients (they differ only in how they send)."""

    def __init__(self, token: str | None, admin_token: str | None, retry: RetryPolicy) -> None:
        self._token, self._admin_token, self.retry = token, admin_token, retry

    def headers(self, call: _Call, request_id: str | None) -> dict[str, str]:
        first, second = (
            (self._admin_token, self._token) if call.admin else (self._token, self._admin_token)
        )
        token = first or second
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if request_id:
            headers["X-Request-ID"] = request_id
        return headers

    def attempts(self, call: _Call, request_id: str | None) -> Generator[Any, Any, Any]:
        """The retry policy, written once for both clients (no I/O here): yields the
        ``request`` arguments of an attempt and receives its response (or has the
        connection error thrown in), yields a float to wait that many seconds, and
        returns the parsed answer or raises."""
        request = {
            "method": call.verb,
            "url": call.path,
            "json": call.json,
            "params": call.params,
            "headers": self.headers(call, request_id),
        }
        for attempt in range(self.retry.retries + 1):
            last = attempt == self.retry.retries
            try:
                response = yield request
            except httpx.ConnectError:
                if last:
                    raise
                yield self.retry.wait_s(attempt, None)
                continue
            if last or response.status_code not in RETRY_STATUSES:
                return self.result(call, response)
            yield self.retry.wait_s(attempt, retry_after_s(response))
        raise AssertionError("unreachable: the last attempt returns or raises")

    @staticmethod
    def result(call: _Call, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise error_of(response)
        return call.model.model_validate(response.json())

    @staticmethod
    def retrieve(query: str, images: Sequence[ImageLike], method: str, profile: str,
                 labels: str | Sequence[str], return_details: bool) -> _Call:  # fmt: skip
        body = {
            "query": query, "images": [encode_image(im) for im in images], "method": method,
            "profile": profile, "labels": _labels(labels), "return_details": return_details,
        }  # fmt: skip
        return _Call("POST", "/v1/retrieve", RetrieveResponse, json=body)

    @staticmethod
    def rerank(query: str, images: Sequence[ImageLike], top_n: int | None,
               options: dict[str, Any]) -> _Call:  # fmt: skip
        body = {"query": query, "documents": [encode_image(im) for im in images],
                "top_n": top_n, **{k: v for k, v in options.items() if v is not None}}
        return _Call("POST", "/v1/rerank", RerankResponse, json=body)

    @staticmethod
    def calibrate(examples: Sequence[Example], profile: str,
                  labels: str | Sequence[str], n: Sequence[int] | str | None = None,
                  ) -> _Call:  # fmt: skip
        body = {
            "profile": profile, "labels": _labels(labels),
            **({} if n is None else {"n": n if isinstance(n, str) else list(n)}),
            "examples": [
                {"query": q, "images": [encode_image(im) for im in ims], "answer": int(answer)}
                for q, ims, answer in examples
            ],
        }  # fmt: skip
        return _Call("POST", "/v1/calibrate", CalibrateResponse, admin=True, json=body)

    @staticmethod
    def profiles(name: str | None) -> _Call:
        if name is None:
            return _Call("GET", "/v1/profiles", ProfileList)
        return _Call("GET", f"/v1/profiles/{name}", ProfileSummary)

    @staticmethod
    def rollback(name: str, n: int, labels: str, version: int | None) -> _Call:
        params: dict[str, Any] = {"n": n, "labels": labels}
        if version is not None:
            params["version"] = version
        return _Call("POST", f"/v1/profiles/{name}/rollback", ProfileRolledBack, admin=True,
                     params=params)  # fmt: skip

    @staticmethod
    def feedback(request_id: str, answer: int) -> _Call:
        body = {"request_id": request_id, "answer": int(answer)}
        return _Call("POST", "/v1/feedback", FeedbackResponse, json=body)

    @staticmethod
    def refresh(name: str, n: int, labels: str, force: bool) -> _Call:
        return _Call("POST", f"/v1/profiles/{name}/refresh", RefreshResponse, admin=True,
                     params={"n": n, "labels": labels, "force": force})  # fmt: skip

    @staticmethod
    def delete(name: str, n: int, labels: str) -> _Call:
        return _Call("DELETE", f"/v1/profiles/{name}", ProfileDeleted, admin=True,
                     params={"n": n, "labels": labels})  # fmt: skip


class LadClient:
    """Synchronous client. ``timeout`` (seconds) bounds each attempt; ``retries`` and
    ``backoff_s`` shape the retry of 429 / 503 / refused connections; pass ``http`` to use
    your own ``httpx.Client`` (its base URL and timeout then apply)."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        token: str | None = None,
        admin_token: str | None = None,
        timeout: float = 120.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        http: httpx.Client | None = None,
    ) -> None:
        self._http = http or httpx.Client(base_url=base_url, timeout=timeout)
        self._owns_http = http is None
        self._api = _Api(token, admin_token, RetryPolicy(retries, backoff_s))

    def __enter__(self) -> LadClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def _send(self, call: _Call, request_id: str | None = None) -> Any:
        steps = self._api.attempts(call, request_id)
        step = next(steps)
        while True:
            try:
                if isinstance(step, float):
                    time.sleep(step)
                    step = steps.send(None)
                    continue
                try:
                    response = self._http.request(**step)
                except httpx.ConnectError as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(response)
            except StopIteration as done:
                return done.value

    def retrieve(self, query: str, images: Sequence[ImageLike], *, method: str = "agd",
                 profile: str = "default", labels: str | Sequence[str] = "digits",
                 return_details: bool = False, request_id: str | None = None,
                 ) -> RetrieveResponse:  # fmt: skip
        """Which image matches ``query``: ``.index`` (0-based), ``.probabilities``..."""
        call = self._api.retrieve(query, images, method, profile, labels, return_details)
        return self._send(call, request_id)

    def rerank(self, query: str, images: Sequence[ImageLike], *, top_n: int | None = None,
               method: str = "agd", profile: str = "default", window: int | None = None,
               seed: int | None = None, request_id: str | None = None,
               ) -> RerankResponse:  # fmt: skip
        """``images`` ordered by match with ``query``: ``.results`` (index, relevance_score),
        best first; ``.meta`` says the windows, the seed and the forward passes spent."""
        options = {"method": method, "profile": profile, "window": window, "seed": seed}
        return self._send(self._api.rerank(query, images, top_n, options), request_id)

    def calibrate(self, examples: Sequence[Example], *, profile: str = "default",
                  labels: str | Sequence[str] = "digits",
                  n: Sequence[int] | str | None = None) -> CalibrateResponse:  # fmt: skip
        """A new profile version from (query, images, 0-based answer) examples of one N;
        with ``n`` (a list of N, or "all") one version per N from the same examples."""
        return self._send(self._api.calibrate(examples, profile, labels, n))

    def profiles(self) -> ProfileList:
        return self._send(self._api.profiles(None))

    def profile(self, name: str) -> ProfileSummary:
        return self._send(self._api.profiles(name))

    def rollback(self, name: str, n: int, labels: str = "digits",
                 version: int | None = None) -> ProfileRolledBack:  # fmt: skip
        return self._send(self._api.rollback(name, n, labels, version))

    def delete(self, name: str, n: int, labels: str = "digits") -> ProfileDeleted:
        return self._send(self._api.delete(name, n, labels))

    def feedback(self, request_id: str, answer: int) -> FeedbackResponse:
        """Which image of the retrieval ``request_id`` (its response's ``request_id``) was
        right; idempotent, so it is safe to retry."""
        return self._send(self._api.feedback(request_id, answer))

    def refresh(self, name: str, n: int, labels: str = "digits",
                force: bool = False) -> RefreshResponse:  # fmt: skip
        """Blend the feedback into profile ``name`` (live only if not less accurate)."""
        return self._send(self._api.refresh(name, n, labels, force))

    def ready(self) -> Readiness:
        """Readiness, also when not ready (503 answers carry the same body)."""
        response = self._http.get("/readyz")
        return Readiness.model_validate(response.json())


class AsyncLadClient:
    """The asynchronous twin of :class:`LadClient` (same arguments, awaitable calls)."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        token: str | None = None,
        admin_token: str | None = None,
        timeout: float = 120.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout)
        self._owns_http = http is None
        self._api = _Api(token, admin_token, RetryPolicy(retries, backoff_s))

    async def __aenter__(self) -> AsyncLadClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def _send(self, call: _Call, request_id: str | None = None) -> Any:
        steps = self._api.attempts(call, request_id)
        step = next(steps)
        while True:
            try:
                if isinstance(step, float):
                    await asyncio.sleep(step)
                    step = steps.send(None)
                    continue
                try:
                    response = await self._http.request(**step)
                except httpx.ConnectError as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(response)
            except StopIteration as done:
                return done.value

    async def retrieve(self, query: str, images: Sequence[ImageLike], *, method: str = "agd",
                       profile: str = "default", labels: str | Sequence[str] = "digits",
                       return_details: bool = False, request_id: str | None = None,
                       ) -> RetrieveResponse:  # fmt: skip
        call = self._api.retrieve(query, images, method, profile, labels, return_details)
        return await self._send(call, request_id)

    async def rerank(self, query: str, images: Sequence[ImageLike], *, top_n: int | None = None,
                     method: str = "agd", profile: str = "default", window: int | None = None,
                     seed: int | None = None, request_id: str | None = None,
                     ) -> RerankResponse:  # fmt: skip
        options = {"method": method, "profile": profile, "window": window, "seed": seed}
        return await self._send(self._api.rerank(query, images, top_n, options), request_id)

    async def calibrate(self, examples: Sequence[Example], *, profile: str = "default",
                        labels: str | Sequence[str] = "digits",
                        n: Sequence[int] | str | None = None) -> CalibrateResponse:  # fmt: skip
        return await self._send(self._api.calibrate(examples, profile, labels, n))

    async def profiles(self) -> ProfileList:
        return await self._send(self._api.profiles(None))

    async def profile(self, name: str) -> ProfileSummary:
        return await self._send(self._api.profiles(name))

    async def rollback(self, name: str, n: int, labels: str = "digits",
                       version: int | None = None) -> ProfileRolledBack:  # fmt: skip
        return await self._send(self._api.rollback(name, n, labels, version))

    async def delete(self, name: str, n: int, labels: str = "digits") -> ProfileDeleted:
        return await self._send(self._api.delete(name, n, labels))

    async def feedback(self, request_id: str, answer: int) -> FeedbackResponse:
        return await self._send(self._api.feedback(request_id, answer))

    async def refresh(self, name: str, n: int, labels: str = "digits",
                      force: bool = False) -> RefreshResponse:  # fmt: skip
        return await self._send(self._api.refresh(name, n, labels, force))

    async def ready(self) -> Readiness:
        response = await self._http.get("/readyz")
        return Readiness.model_validate(response.json())
