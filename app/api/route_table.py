"""The routes as this server serves them: each wire route of ``lad_client.routes`` with
the server's own limit on its body and its wire models as classes.

The client package holds the wire only (paths, types named by their class, codes); how
large a body the server takes is the server's business, so it lives here: the body guard
(``app.api.middleware``) and the limits page (``tools.docs.limits``) read it. The route
modules name their route by its constant (``RETRIEVE``, ...), and the body readers and the
route decorator take the models from it: nothing is looked up by name per request.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from lad_client import routes as wire_routes
from lad_client import types as wire_types

SMALL_BODY_BYTES = 64 * 1024
"""Body limit of every route whose ``body_limit`` is None (the routes that take no body)."""

BODY_LIMITS: dict[str, str] = {
    "retrieve": "max_body_bytes",
    "rerank": "max_body_bytes",
    "rerank_v2": "max_body_bytes",
    "rerank_unversioned": "max_body_bytes",
    "calibrate": "max_calibrate_body_bytes",
}
"""Route name -> the setting that bounds its body (read once, when the body guard is built);
a route not listed takes at most SMALL_BODY_BYTES."""


MODELS: dict[str, Any] = {
    name: getattr(wire_types, name)
    for route in wire_routes.ROUTES
    for name in (route.request, route.response, route.form_options)
    if name
}
"""The wire models the table names, by class name (resolved once, when the table is built:
a name the client's types lack fails at import, never on a request)."""


@dataclass(frozen=True)
class ServedRoute(wire_routes.Route):
    """A wire route, the setting that bounds its body on this server, and its models."""

    body_limit: str | None = None
    """The Settings attribute that bounds the body (None: SMALL_BODY_BYTES)."""
    request_model: Any = None
    """The class of ``request`` (None: no body)."""
    response_model: Any = None
    """The class of ``response`` (None: not JSON)."""
    options_model: Any = None
    """The class of ``form_options`` (None: no form)."""

    @property
    def limit_setting(self) -> str:
        """The environment variable of the body limit, as error messages name it."""
        if self.body_limit is None:
            return "fixed for routes without a body"
        return "LAD_" + self.body_limit.upper()


def _served(route: wire_routes.Route) -> ServedRoute:
    return ServedRoute(
        **asdict(route),
        body_limit=BODY_LIMITS.get(route.name),
        request_model=MODELS.get(route.request or ""),
        response_model=MODELS.get(route.response or ""),
        options_model=MODELS.get(route.form_options or ""),
    )


ROUTES: tuple[ServedRoute, ...] = tuple(_served(route) for route in wire_routes.ROUTES)
"""Every route the service serves, in the wire table's order."""

BY_NAME: dict[str, ServedRoute] = {route.name: route for route in ROUTES}

(
    RETRIEVE,
    RERANK,
    RERANK_V2,
    RERANK_UNVERSIONED,
    CALIBRATE,
    LIST_MODELS,
    LIST_PROFILES,
    GET_PROFILE,
    DELETE_PROFILE,
    ROLLBACK_PROFILE,
    FEEDBACK,
    REFRESH_PROFILE,
    HEALTHZ,
    READYZ,
    METRICS,
) = ROUTES
"""Each route by its constant, for the route modules (the table's order; a test checks
each constant's name)."""

PATTERNS: tuple[tuple[ServedRoute, re.Pattern[str]], ...] = tuple(
    (BY_NAME[route.name], pattern) for route, pattern in wire_routes.PATTERNS
)
"""Each route with the pattern of the concrete paths it serves, in the table's order."""


def find(method: str, path: str) -> ServedRoute | None:
    """The route a request for ``path`` (not a template) reaches, or None."""
    route = wire_routes.find(method, path)
    return None if route is None else BY_NAME[route.name]
