"""The routes as this server serves them: each wire route of ``lad_client.routes`` with
the server's own limit on its body.

The client package holds the wire only (paths, types, codes); how large a body the server
takes is the server's business, so it lives here: the body guard (``app.api.middleware``)
and the limits page (``tools.docs.limits``) read it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from lad_client import routes as wire_routes

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


@dataclass(frozen=True)
class ServedRoute(wire_routes.Route):
    """A wire route and the setting that bounds its body on this server."""

    body_limit: str | None = None
    """The Settings attribute that bounds the body (None: SMALL_BODY_BYTES)."""

    @property
    def limit_setting(self) -> str:
        """The environment variable of the body limit, as error messages name it."""
        if self.body_limit is None:
            return "fixed for routes without a body"
        return "LAD_" + self.body_limit.upper()


ROUTES: tuple[ServedRoute, ...] = tuple(
    ServedRoute(**asdict(route), body_limit=BODY_LIMITS.get(route.name))
    for route in wire_routes.ROUTES
)
"""Every route the service serves, in the wire table's order."""

BY_NAME: dict[str, ServedRoute] = {route.name: route for route in ROUTES}

PATTERNS: tuple[tuple[ServedRoute, re.Pattern[str]], ...] = tuple(
    (BY_NAME[route.name], pattern) for route, pattern in wire_routes.PATTERNS
)
"""Each route with the pattern of the concrete paths it serves, in the table's order."""


def find(method: str, path: str) -> ServedRoute | None:
    """The route a request for ``path`` (not a template) reaches, or None."""
    route = wire_routes.find(method, path)
    return None if route is None else BY_NAME[route.name]
