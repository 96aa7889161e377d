"""The one table of the service's HTTP routes: for each, what a client and the server must
agree on (path, method, token, body, error codes, response), and what the server does at
its edge (audit line). The server's limits (how large a body, how many images) live in the
server (``app.api.route_table``), not here.

Pure data, standard library only: the clients take each call's method, path and token
from it (``lad_client.calls``), and on the server the route decorators
(``app.api.registry``), the body guard (``app.api.route_table``), the OpenAPI error
and request-body docs (``app.api.route_errors``, ``app.api.openapi``), the audit log
(``app.observability.logs``) and the content-type check (``app.api.bodies``) are all derived from
``ROUTES``. Error codes are the wire codes (``app.errors`` maps each to its class and HTTP
status); models are named by their class in ``lad_client.types``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

Auth = Literal["none", "api_key", "admin"]
"""none: open; api_key: LAD_RETRIEVE_TOKEN (the admin token is accepted too) when set;
admin: LAD_ADMIN_TOKEN when set."""

JSON = "application/json"
FORM = "multipart/form-data"


@dataclass(frozen=True)
class Route:
    """One HTTP route and everything both ends must agree on."""

    name: str
    """Its name: the handler's, and FastAPI's route name (scope["route"].name)."""
    method: str
    path: str
    """The template, ``{name}`` for path parameters."""
    summary: str
    response: str | None
    """The response model's class name in lad_client.types (None: not JSON, e.g. /metrics)."""
    errors: tuple[str, ...]
    """The error codes it may answer, as sent in ``error.code``."""
    auth: Auth = "none"
    content_types: tuple[str, ...] = ()
    """The request body's accepted media types (``+json`` suffixes count as JSON); () = none."""
    request: str | None = None
    """The JSON request model's class name in lad_client.types (None: no body)."""
    form_files: str | None = None
    """In a multipart/form-data body, the field that carries the image files."""
    form_options: str | None = None
    """In a multipart/form-data body, the model (class name in lad_client.types) of its
    text fields other than ``query`` (None: the route takes no form)."""
    form_labels: bool = False
    """Whether the form's ``labels`` field is label text: a scheme name, a JSON list or a
    comma list of the N labels (a JSON body sends a list as a list)."""
    audit: str | None = None
    """The audited admin action (an ``lad.audit`` line per request), or None."""
    alias_of: str | None = None
    """The route whose handler also serves this path (another API's path for the same
    call, e.g. Cohere v2's /v2/rerank for rerank), or None."""


# error codes shared by groups of routes
ANY = ("bad_request", "request_timeout", "payload_too_large", "internal_error")
"""What any route may answer: a malformed request, a body over the route's limit or too slow
(the body guard), an unexpected failure."""
MODEL = (*ANY, "invalid_request", "not_ready", "overloaded", "deadline_exceeded")
"""Routes that need the loaded model and its worker (they also validate parameters), and
count towards LAD_MAX_IN_FLIGHT; they honour X-Request-Timeout."""
BODY = ("unsupported_media_type",)
"""Routes that read a body of given content types."""
IMAGES = (
    "invalid_image",
    "unsupported_image_format",
    "unsupported_image",
    "image_too_large",
    "too_many_images",
    "too_few_images",
    "invalid_query",
    "invalid_labels",
    "prompt_too_long",
    "media_not_allowed",
    "media_fetch_failed",
    "media_fetch_timeout",
)
"""Routes that decode a query and candidate images (image URLs fetched where allowed)."""
AUTH = ("unauthorized", "forbidden")
ADMIN = (*AUTH, "store_unavailable")
"""Admin routes: a token, and the store behind them."""
PROFILE_KEY = ("invalid_labels", "profile_not_found")
"""Routes addressed to one stored profile (name, labels, N)."""
SCORING = ("calibration_required", "profile_mismatch", "engine_error")
"""Routes that score with a calibrated profile."""


def _codes(*groups: tuple[str, ...]) -> tuple[str, ...]:
    """The groups' codes, each once, in order."""
    return tuple(dict.fromkeys(code for group in groups for code in group))


RERANK = Route(
    "rerank",
    "POST",
    "/v1/rerank",
    "Rerank candidate images for a query (windowed, position-debiased tournament)",
    "RerankResponse",
    _codes(MODEL, BODY, IMAGES, AUTH, SCORING, ("model_not_found",)),
    auth="api_key",
    content_types=(JSON, FORM),
    request="RerankRequest",
    form_files="documents",
    form_options="RerankOptions",
)

RERANK_ALIASES = tuple(
    replace(RERANK, name=name, path=path, summary=f"{RERANK.summary}; {why}", alias_of="rerank")
    for name, path, why in (
        ("rerank_v2", "/v2/rerank", "Cohere v2's path (ClientV2), as POST /v1/rerank"),
        ("rerank_unversioned", "/rerank", "vLLM's unversioned path, as POST /v1/rerank"),
    )
)
"""POST /v1/rerank under the paths other rerank APIs' clients post to (vLLM serves the
same three): one handler, one request and response shape."""


ROUTES: tuple[Route, ...] = (
    Route(
        "retrieve",
        "POST",
        "/v1/retrieve",
        "Pick the image that matches the query, with position debiasing",
        "RetrieveResponse",
        _codes(MODEL, BODY, IMAGES, AUTH, SCORING),
        auth="api_key",
        content_types=(JSON, FORM),
        request="RetrieveRequest",
        form_files="images",
        form_options="RetrieveOptions",
        form_labels=True,
    ),
    RERANK,
    *RERANK_ALIASES,
    Route(
        "calibrate",
        "POST",
        "/v1/calibrate",
        "Calibrate a profile (bias matrix B and attention prior P) for one N",
        "CalibrateResponse",
        _codes(MODEL, BODY, IMAGES, ADMIN, ("invalid_calibration", "engine_error")),
        auth="admin",
        content_types=(JSON,),
        request="CalibrateRequest",
        audit="calibrate",
    ),
    Route(
        "list_models",
        "GET",
        "/v1/models",
        "The served model, in OpenAI's list shape",
        "ModelList",
        MODEL,
    ),
    Route(
        "list_profiles",
        "GET",
        "/v1/profiles",
        "Every profile of the running model",
        "ProfileList",
        _codes(MODEL, ("store_unavailable",)),
    ),
    Route(
        "get_profile",
        "GET",
        "/v1/profiles/{name}",
        "One profile: every (labels, N) with its kept versions",
        "ProfileSummary",
        _codes(MODEL, ("profile_not_found", "store_unavailable", "store_corrupt")),
    ),
    Route(
        "delete_profile",
        "DELETE",
        "/v1/profiles/{name}",
        "Delete every version of a profile for one N",
        "ProfileDeleted",
        _codes(MODEL, PROFILE_KEY, ADMIN),
        auth="admin",
        audit="delete",
    ),
    Route(
        "rollback_profile",
        "POST",
        "/v1/profiles/{name}/rollback",
        "Make the previous kept version current again",
        "ProfileRolledBack",
        _codes(MODEL, PROFILE_KEY, ADMIN, ("no_previous_version", "store_corrupt")),
        auth="admin",
        audit="rollback",
    ),
    Route(
        "feedback",
        "POST",
        "/v1/feedback",
        "Tell the service which candidate of an earlier retrieval was right",
        "FeedbackResponse",
        _codes(MODEL, BODY, AUTH, ("request_not_found", "profile_deleted", "store_unavailable")),
        auth="api_key",
        content_types=(JSON,),
        request="FeedbackRequest",
    ),
    Route(
        "refresh_profile",
        "POST",
        "/v1/profiles/{name}/refresh",
        "Blend feedback into a profile; live only if not less accurate",
        "RefreshResponse",
        _codes(MODEL, PROFILE_KEY, ADMIN, ("refresh_unavailable",)),
        auth="admin",
        audit="refresh",
    ),
    Route("healthz", "GET", "/healthz", "The process is alive", "Health", ANY),
    Route(
        "readyz",
        "GET",
        "/readyz",
        "Can answer retrieve: 200 while the model is loaded, store ok or degraded",
        "Readiness",
        _codes(ANY, ("not_ready",)),
    ),
    Route("metrics", "GET", "/metrics", "Prometheus metrics", None, ANY),
)
"""Every route the service serves (the docs pages and their assets aside)."""

BY_NAME: dict[str, Route] = {route.name: route for route in ROUTES}


def _pattern(path: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path)))


PATTERNS = tuple((route, _pattern(route.path)) for route in ROUTES)
"""Each route with the pattern of the concrete paths it serves, in the table's order."""


def find(method: str, path: str) -> Route | None:
    """The route a request for ``path`` (not a template) reaches, or None."""
    for route, pattern in PATTERNS:
        if route.method == method and pattern.fullmatch(path):
            return route
    return None
