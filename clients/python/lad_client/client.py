"""Python clients of the service for retrieval back-ends: ``LadClient`` and ``AsyncLadClient``.

Both take images as encoded bytes, file paths or PIL images (sent as base64 JSON), return
the service's own response models (``lad_client.types``: typed, validated), time out, and
retry what is worth retrying: 429 (queue full) and 503 (not ready, store down) with
exponential backoff that honours ``Retry-After``, and connections that could not be opened.
Any other error answer raises :class:`LadError` with the service's ``code`` and ``message``,
so a caller can branch on ``calibration_required``; no answer at all (refused after the
retries, timed out) raises its subclass :class:`LadConnectionError`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import httpx

from lad_client.calls import Api, Call, Example, ImageLike
from lad_client.retry import RetryPolicy
from lad_client.routes import BY_NAME
from lad_client.types import (
    CalibrateResponse,
    FeedbackResponse,
    ModelList,
    ProfileDeleted,
    ProfileList,
    ProfileRolledBack,
    ProfileSummary,
    Readiness,
    RefreshResponse,
    RerankResponse,
    RetrieveResponse,
)


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
        self._api = Api(token, admin_token, RetryPolicy(retries, backoff_s))

    def __enter__(self) -> LadClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def _send(self, call: Call, request_id: str | None = None) -> Any:
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
                except httpx.TransportError as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(response)
            except StopIteration as done:
                return done.value

    def retrieve(
        self,
        query: str,
        images: Sequence[ImageLike],
        *,
        method: str = "agd",
        profile: str = "default",
        labels: str | Sequence[str] = "digits",
        return_details: bool = False,
        request_id: str | None = None,
    ) -> RetrieveResponse:
        """Which image matches ``query``: ``.index`` (0-based), ``.probabilities``..."""
        call = self._api.retrieve(query, images, method, profile, labels, return_details)
        return self._send(call, request_id)

    def rerank(
        self,
        query: str,
        images: Sequence[ImageLike],
        *,
        top_n: int | None = None,
        method: str = "agd",
        profile: str = "default",
        window: int | None = None,
        seed: int | None = None,
        model: str | None = None,
        return_documents: bool = False,
        request_id: str | None = None,
    ) -> RerankResponse:
        """``images`` ordered by match with ``query``: ``.results`` (index, relevance_score,
        with ``return_documents`` the document as sent), best first; ``.usage`` and
        ``.meta`` say the windows, the seed and the forward passes spent. ``model``, when
        given, must be the served id (``models()``)."""
        options = {
            "method": method,
            "profile": profile,
            "window": window,
            "seed": seed,
            "model": model,
            "return_documents": return_documents or None,
        }
        return self._send(self._api.rerank(query, images, top_n, options), request_id)

    def models(self) -> ModelList:
        """The served model (OpenAI's list shape): ``.data[0].id``."""
        return self._send(self._api.models())

    def calibrate(
        self,
        examples: Sequence[Example],
        *,
        profile: str = "default",
        labels: str | Sequence[str] = "digits",
        n: Sequence[int] | str | None = None,
    ) -> CalibrateResponse:
        """A new profile version from (query, images, 0-based answer) examples of one N;
        with ``n`` (a list of N, or "all") one version per N from the same examples."""
        return self._send(self._api.calibrate(examples, profile, labels, n))

    def profiles(self) -> ProfileList:
        return self._send(self._api.profiles(None))

    def profile(self, name: str) -> ProfileSummary:
        return self._send(self._api.profiles(name))

    def rollback(
        self, name: str, n: int, labels: str = "digits", version: int | None = None
    ) -> ProfileRolledBack:
        return self._send(self._api.rollback(name, n, labels, version))

    def delete(self, name: str, n: int, labels: str = "digits") -> ProfileDeleted:
        return self._send(self._api.delete(name, n, labels))

    def feedback(self, request_id: str, answer: int) -> FeedbackResponse:
        """Which image of the retrieval ``request_id`` (its response's ``request_id``) was
        right; idempotent, so it is safe to retry."""
        return self._send(self._api.feedback(request_id, answer))

    def refresh(
        self, name: str, n: int, labels: str = "digits", force: bool = False
    ) -> RefreshResponse:
        """Blend the feedback into profile ``name`` (live only if not less accurate)."""
        return self._send(self._api.refresh(name, n, labels, force))

    def ready(self) -> Readiness:
        """Readiness, also when not ready (503 answers carry the same body)."""
        response = self._http.get(BY_NAME["readyz"].path)
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
        self._api = Api(token, admin_token, RetryPolicy(retries, backoff_s))

    async def __aenter__(self) -> AsyncLadClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def _send(self, call: Call, request_id: str | None = None) -> Any:
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
                except httpx.TransportError as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(response)
            except StopIteration as done:
                return done.value

    async def retrieve(
        self,
        query: str,
        images: Sequence[ImageLike],
        *,
        method: str = "agd",
        profile: str = "default",
        labels: str | Sequence[str] = "digits",
        return_details: bool = False,
        request_id: str | None = None,
    ) -> RetrieveResponse:
        call = self._api.retrieve(query, images, method, profile, labels, return_details)
        return await self._send(call, request_id)

    async def rerank(
        self,
        query: str,
        images: Sequence[ImageLike],
        *,
        top_n: int | None = None,
        method: str = "agd",
        profile: str = "default",
        window: int | None = None,
        seed: int | None = None,
        model: str | None = None,
        return_documents: bool = False,
        request_id: str | None = None,
    ) -> RerankResponse:
        options = {
            "method": method,
            "profile": profile,
            "window": window,
            "seed": seed,
            "model": model,
            "return_documents": return_documents or None,
        }
        return await self._send(self._api.rerank(query, images, top_n, options), request_id)

    async def models(self) -> ModelList:
        return await self._send(self._api.models())

    async def calibrate(
        self,
        examples: Sequence[Example],
        *,
        profile: str = "default",
        labels: str | Sequence[str] = "digits",
        n: Sequence[int] | str | None = None,
    ) -> CalibrateResponse:
        return await self._send(self._api.calibrate(examples, profile, labels, n))

    async def profiles(self) -> ProfileList:
        return await self._send(self._api.profiles(None))

    async def profile(self, name: str) -> ProfileSummary:
        return await self._send(self._api.profiles(name))

    async def rollback(
        self, name: str, n: int, labels: str = "digits", version: int | None = None
    ) -> ProfileRolledBack:
        return await self._send(self._api.rollback(name, n, labels, version))

    async def delete(self, name: str, n: int, labels: str = "digits") -> ProfileDeleted:
        return await self._send(self._api.delete(name, n, labels))

    async def feedback(self, request_id: str, answer: int) -> FeedbackResponse:
        return await self._send(self._api.feedback(request_id, answer))

    async def refresh(
        self, name: str, n: int, labels: str = "digits", force: bool = False
    ) -> RefreshResponse:
        return await self._send(self._api.refresh(name, n, labels, force))

    async def ready(self) -> Readiness:
        response = await self._http.get(BY_NAME["readyz"].path)
        return Readiness.model_validate(response.json())
