"""/docs (Swagger UI) and /redoc from assets served by the service itself, not a CDN.

FastAPI's own pages load their JavaScript and CSS from a public CDN, which leaves them
blank in an offline cluster. The assets here come from the ``fastapi-offline`` package
(Swagger UI, Apache-2.0; ReDoc, MIT) and are served under ``/docs-assets``. Swagger UI's
online validator badge (a request to an outside host) is turned off, as are ReDoc's
Google fonts.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/docs-assets"
SWAGGER_PARAMETERS = {"validatorUrl": None, "tryItOutEnabled": True}


def install_docs(app: FastAPI) -> None:
    """Serve /docs and /redoc with local assets (create the app with docs_url=None)."""
    assets = str(files("fastapi_offline") / "static")
    app.mount(ASSETS_PATH, StaticFiles(directory=assets), name="docs-assets")
    oauth_redirect = "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{oauth_redirect}",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            swagger_ui_parameters=SWAGGER_PARAMETERS,
        )

    @app.get(oauth_redirect, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            with_google_fonts=False,
        )
