"""POST /v1/rerank: JSON (base64 / data URL documents) or multipart/form-data (image files)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from app.api.bodies import read_query_body
from app.api.deps import RetrieveAuth, ServiceDep, SettingsDep
from app.api.openapi import json_or_form_body
from app.api.route_errors import error_responses
from app.engine.labels import SCHEMES
from app.engine.methods import METHODS
from app.service.rerank import rerank as run_rerank
from app.settings import MAX_N
from calibration_store.profile import NAME_PATTERN
from lad_client.types import RERANK_EXAMPLE, RerankOptions, RerankRequest, RerankResponse

router = APIRouter(tags=["rerank"])

_INT = {"type": "integer", "minimum": 0}
_MULTIPART_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["query", "documents"],
    "additionalProperties": False,
    "properties": {
        "query": {"type": "string", "minLength": 1, "description": "the caption to match"},
        "documents": {"type": "array", "items": {"type": "string", "format": "binary"},
                      "minItems": 2, "maxItems": MAX_N,
                      "description": "2..LAD_MAX_RERANK_CANDIDATES candidate image files"},
        "top_n": {**_INT, "minimum": 1, "description": "results to return (default: all)"},
        "method": {"type": "string", "enum": list(METHODS), "default": "agd",
                   "description": "the method applied in every window"},
        "profile": {"type": "string", "pattern": NAME_PATTERN, "default": "default",
                    "description": "calibration profile name"},
        "labels": {"type": "string", "enum": list(SCHEMES), "default": "digits",
                   "description": "label scheme name"},
        "window": {**_INT, "minimum": 2, "description": "largest window size"},
        "seed": {**_INT, "description": "seed of the window assignment"},
    },
}  # fmt: skip
_OPENAPI = json_or_form_body(RerankRequest, RERANK_EXAMPLE, _MULTIPART_SCHEMA)
DESCRIPTION = """Order up to LAD_MAX_RERANK_CANDIDATES candidate images by how well they match
`query`, position-debiased. Up to the window size (default: the largest N the profile is
calibrated for) the documents are one prompt. Above it a **windowed tournament** runs: each
round the surviving documents are shuffled with `seed` (returned in `meta`) and dealt into
near-equal windows of at most `window` images; every window is scored (all windows of a round
in one batch of forward passes) and debiased with the profile of its own N; the best
min(top_n, size - 1) of each window advance, until one window remains. The ranking orders
documents by the round they reached, then by their probability in their last window.
`meta.forward_passes` is what it cost (perm_avg: N passes per window)."""


@router.post(
    "/v1/rerank",
    response_model=RerankResponse,
    dependencies=[RetrieveAuth],
    openapi_extra=_OPENAPI,
    responses=error_responses("POST", "/v1/rerank"),
    summary="Rerank candidate images for a query (windowed, position-debiased tournament)",
    description=DESCRIPTION,
)
async def rerank(request: Request, service: ServiceDep, settings: SettingsDep) -> RerankResponse:
    options: RerankOptions
    options, query, documents = await read_query_body(
        request, settings, json_model=RerankRequest, options_model=RerankOptions,
        files_field="documents", max_files=settings.max_rerank_candidates,
    )  # fmt: skip
    return await run_rerank(service, query, documents, options)
