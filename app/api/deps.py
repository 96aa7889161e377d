"""Typed dependencies: the service, each feature's handler, the settings and the two
optional bearer tokens.

All ``async def``: none of them blocks, and FastAPI runs a plain ``def`` dependency in
its thread pool, two thread hand-offs per dependency on every request."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from app import errors
from app.observability import logs
from app.service import Service
from app.service.handlers import Calibrate, Feedback, Profiles, Refresh, Rerank, Retrieve
from app.settings import Settings

_bearer = HTTPBearer(auto_error=False, description="LAD_RETRIEVE_TOKEN or LAD_ADMIN_TOKEN")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_service(request: Request) -> Service:
    service = getattr(request.app.state, "service", None)
    if service is None or not service.worker.running:
        raise errors.NotReady("the model is not loaded yet; retry shortly")
    return service


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServiceDep = Annotated[Service, Depends(get_service)]


async def retrieve_handler(service: ServiceDep) -> Retrieve:
    return service.handlers.retrieve


async def rerank_handler(service: ServiceDep) -> Rerank:
    return service.handlers.rerank


async def calibrate_handler(service: ServiceDep) -> Calibrate:
    return service.handlers.calibrate


async def feedback_handler(service: ServiceDep) -> Feedback:
    return service.handlers.feedback


async def refresh_handler(service: ServiceDep) -> Refresh:
    return service.handlers.refresh


async def profiles_handler(service: ServiceDep) -> Profiles:
    return service.handlers.profiles


RetrieveDep = Annotated[Retrieve, Depends(retrieve_handler)]
RerankDep = Annotated[Rerank, Depends(rerank_handler)]
CalibrateDep = Annotated[Calibrate, Depends(calibrate_handler)]
FeedbackDep = Annotated[Feedback, Depends(feedback_handler)]
RefreshDep = Annotated[Refresh, Depends(refresh_handler)]
ProfilesDep = Annotated[Profiles, Depends(profiles_handler)]
"""Each route's handler (the service must be ready: ``get_service``)."""


def _check_token(
    credentials: HTTPAuthorizationCredentials | None, accepted: dict[str, SecretStr], what: str
) -> None:
    """Constant-time comparison against every accepted token; no token configured = open.

    The name of the token that matched ("admin", "retrieve", or "open" when none is
    configured) goes into the request's log record: the audit lines say who acted.
    """
    if not accepted:
        logs.note(token="open")
        return
    if credentials is None or not credentials.credentials:
        raise errors.Unauthorized(f"{what} needs a bearer token (Authorization: Bearer <token>)")
    given = credentials.credentials.encode()
    matches = {
        name: hmac.compare_digest(given, t.get_secret_value().encode())
        for name, t in accepted.items()
    }
    matched = [name for name, ok in matches.items() if ok]
    if not matched:
        raise errors.Forbidden(f"the bearer token is not valid for {what}")
    logs.note(token=matched[0])


async def require_retrieve_token(settings: SettingsDep, credentials: Credentials) -> None:
    """LAD_RETRIEVE_TOKEN, when set, guards retrieval; the admin token is accepted too."""
    accepted = {}
    if settings.retrieve_token is not None:
        accepted["retrieve"] = settings.retrieve_token
        if settings.admin_token is not None:
            accepted["admin"] = settings.admin_token
    _check_token(credentials, accepted, "retrieval")


async def require_admin_token(settings: SettingsDep, credentials: Credentials) -> None:
    """LAD_ADMIN_TOKEN, when set, guards calibrate, delete and rollback."""
    accepted = {"admin": settings.admin_token} if settings.admin_token is not None else {}
    _check_token(credentials, accepted, "this admin operation")


RetrieveAuth = Depends(require_retrieve_token)
AdminAuth = Depends(require_admin_token)
