"""POST /v1/rerank: JSON (base64 / data URL documents) or multipart/form-data (image files);
the same handler answers POST /v2/rerank (Cohere's ClientV2) and POST /rerank (vLLM's path)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.api.bodies import read_query_body
from app.api.deps import RerankDep, SettingsDep
from app.api.registry import Handler, register
from app.api.route_table import RERANK, RERANK_UNVERSIONED, RERANK_V2
from lad_client.types import RerankResponse

router = APIRouter(tags=["rerank"])

DESCRIPTION = """Order up to LAD_MAX_RERANK_CANDIDATES candidate images by how well they match
`query`, position-debiased. Up to the window size (default: the largest N the profile is
calibrated for; LAD_MAX_IMAGES for vanilla, attn_raw and perm_avg, which read no profile) the
documents are one prompt. Above it a **windowed tournament** runs: each
round the surviving documents are shuffled with `seed` (returned in `meta`) and dealt into
near-equal windows of at most `window` images; every window is scored (all windows of a round
in one batch of forward passes) and debiased with the profile of its own N; the best
min(top_n, size - 1) of each window advance, until one window remains. The ranking orders
documents by the round they reached, then by their probability in their last window;
`relevance_score` follows that order across windows (see its description).
`meta.forward_passes` is what it cost (perm_avg: N passes per window); `usage` sums it up.

The JSON body takes the common rerank shape too (Cohere v1 and v2, Jina, vLLM, Infinity): `model`
(the id of GET /v1/models; another is 404 `model_not_found`), `documents` as strings or image
objects, `top_n` (more than there are documents is clipped), `return_documents` (each result
echoes its document: a string as `{"text": ...}`, an object as sent; without it results carry
no `document` key). One document is answered without a forward pass (relevance_score 1.0).
Fields of other rerank APIs that change nothing here (Cohere's `max_tokens_per_doc`,
Infinity's `raw_scores`, vLLM's `truncate_prompt_tokens`, any other unknown field) are
accepted, ignored, counted in `lad_rerank_ignored_fields_total` and named in the request's log
line; a multipart form stays strict. `usage` carries `prompt_tokens` and `total_tokens`.
An http(s) image URL is fetched only from the hosts the operator allows (by default none:
400 `media_not_allowed`; docs/api.md "Images by URL"). The
same call answers on POST /v1/rerank, /v2/rerank (Cohere's ClientV2) and /rerank (vLLM's path)."""


def _register_everywhere(handler: Handler) -> Handler:
    """The handler under POST /v1/rerank and under each of its aliases' paths."""
    for route in (RERANK, RERANK_V2, RERANK_UNVERSIONED):
        register(router, route, description=DESCRIPTION)(handler)
    return handler


@_register_everywhere
async def rerank(request: Request, handler: RerankDep, settings: SettingsDep) -> JSONResponse:
    most = settings.max_rerank_candidates
    options, query, documents = await read_query_body(request, settings, RERANK, most)
    answer: RerankResponse = await handler(options, query, documents)
    return JSONResponse(answer.wire())  # a result's document absent, not null, unless asked
