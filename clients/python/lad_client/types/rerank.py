"""POST /v1/rerank: a query and many candidate images, ranked by windowed tournament."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from lad_client.types.common import EXAMPLE_IMAGES, Strict
from lad_client.types.documents import (
    ContentDocuments,
    Document,
    SentDocument,
    as_sent,
    image_of,
)
from lad_client.vocabulary import IGNORED_RERANK_FIELDS, METHODS, NAME_PATTERN, SCHEMES, Method

RERANK_EXAMPLE: dict[str, object] = {
    "query": "a small green square",
    "documents": list(EXAMPLE_IMAGES),
    "top_n": 2,
    "return_documents": False,
    "method": "vanilla",
    "seed": 7,
}


DocumentList = Annotated[list[Document], Field(min_length=1)]
"""The documents; how many a server takes is its own setting (LAD_MAX_RERANK_CANDIDATES),
checked and named by the server, never capped here."""


class RerankOptions(Strict):
    """How to rerank (shared by the JSON and the multipart encodings of POST /v1/rerank)."""

    top_n: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="results to return; more than there are documents is clipped to their "
        "number (as vLLM does). The best top_n of each window advance (the winner and, for "
        "top_n > 1, runners-up), or the best half of each window where that would cost more "
        "than twice a top-1 rerank (successive halving: a full ranking costs at most about 2x "
        "a top-1 one). Unset: every document is returned, ranked, with only window winners "
        "advancing (the cheapest tournament)",
    )
    method: Method = Field("agd", description=f"one of {', '.join(METHODS)}; agd is the default")
    profile: str = Field("default", pattern=NAME_PATTERN, description="calibration profile name")
    labels: str = Field(
        "digits",
        pattern="^(" + "|".join(SCHEMES) + ")$",
        description="label scheme name (windows vary in N: no custom lists)",
    )
    window: int | None = Field(
        None,
        ge=2,
        description="largest window (N per prompt); default: the "
        "largest N the profile is calibrated for (LAD_MAX_IMAGES for methods without one)",
    )
    seed: int | None = Field(
        None,
        ge=0,
        le=2**32 - 1,
        description="seed of the window assignment (same seed, "
        "same documents: same windows); default: a fresh one, returned in meta",
    )
    return_documents: bool = Field(
        False,
        description="echo each result's document: a string as {\"text\": <it>} (Cohere's and "
        "vLLM's answer), an object as it was sent, a file part of a multipart body as "
        '{"text": <its bytes in base64>}. False: results carry no `document` key',
    )
    model: str | None = Field(
        None,
        max_length=512,
        description="the served model id (GET /v1/models); another id "
        "is 404 model_not_found; unset: the served model",
    )


class RerankRequest(RerankOptions):
    """A query and its candidate images, in the shape common rerank APIs use.

    Fields of other rerank APIs that change nothing for an image ranking are accepted and
    ignored, the well-known ones (``IGNORED_RERANK_FIELDS``) and any other: each is
    counted (``lad_rerank_ignored_fields_total``) and named in the request's log line."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [RERANK_EXAMPLE]})

    query: str = Field(min_length=1, max_length=100_000, description="the caption to match")
    max_tokens_per_doc: int | None = Field(
        None,
        description="Cohere v2's text truncation; accepted and ignored (an image "
        "document is never truncated)",
    )
    max_chunks_per_doc: int | None = Field(
        None, description="Cohere v1's chunking of long texts; accepted and ignored"
    )
    rank_fields: list[str] | None = Field(
        None,
        description="Cohere v1's fields of object documents to rank; accepted and ignored "
        "(an object document's image field is ranked)",
    )
    raw_scores: bool | None = Field(
        None, description="Infinity's raw (unnormalised) scores; accepted and ignored"
    )
    documents: DocumentList | ContentDocuments = Field(
        description="1..LAD_MAX_RERANK_CANDIDATES candidate images, each a data:image/...;"
        'base64, URL or bare base64 string, Cohere\'s {"text": ...}, Jina\'s {"image": ...}, '
        "an image_url content part "
        '{"type": "image_url", "image_url": {"url": ...}} or vLLM\'s {"content": [<one image_url '
        'part>]}; or vLLM\'s {"content": [<image_url parts>]} (one document per part). An '
        "http(s) image URL is fetched only from the hosts the operator allows "
        "(LAD_MEDIA_ALLOWED_DOMAINS; empty by default: 400 media_not_allowed)",
    )

    def listed(self) -> list[Document]:
        """The documents one per candidate, whichever shape the list came in."""
        if isinstance(self.documents, ContentDocuments):
            return list(self.documents.content)
        return list(self.documents)

    def images(self) -> list[str]:
        """Each document's image string (data URL or base64), in order."""
        return [image_of(d) for d in self.listed()]

    def sent(self) -> list[SentDocument]:
        """Each document as ``return_documents`` echoes it."""
        return [as_sent(d) for d in self.listed()]

    def ignored(self) -> list[str]:
        """The fields sent that change nothing: the well-known ones declared here, then
        any other, in the order sent (names as sent: escape them before logging)."""
        sent = self.model_fields_set  # extra fields included
        declared = [f for f in type(self).model_fields if f in IGNORED_RERANK_FIELDS and f in sent]
        return [*declared, *(self.model_extra or {})]


class RerankResult(BaseModel):
    """One document of the ranking."""

    index: int = Field(description="0-based index into `documents`")
    relevance_score: float = Field(
        description="in [0, 1], consistent with the ranking across windows: (r - 1 + p) / R, "
        "where R is the number of rounds played, r the round the document reached and p its "
        "debiased probability in the window it last played. Every document that reached a "
        "later round scores higher than every one eliminated earlier; with one window (R = 1) "
        "it is the debiased probability itself. Comparable within one response, not across "
        "requests"
    )
    document: SentDocument | None = Field(
        None,
        description='with return_documents: the document, a string as {"text": <it>}, an '
        "object as it was sent; without it the key is absent (never null)",
    )


class RerankUsage(BaseModel):
    """What the request cost."""

    images: int = Field(description="candidate images decoded")
    prompt_tokens: int | None = Field(
        description="tokens of every forward pass's prompt, images included, summed over the "
        "tournament (0 when no forward pass ran; null if the engine does not report them)"
    )
    total_tokens: int | None = Field(
        description="prompt_tokens again (a rerank generates nothing), as vLLM, Infinity and "
        "LiteLLM read it"
    )
    forward_passes: int = Field(description="forward passes spent (as meta.forward_passes)")


class RerankBilledUnits(BaseModel):
    """Cohere's ``meta.billed_units``, for clients that read the cost there (LiteLLM)."""

    images: int = Field(description="candidate images decoded (as usage.images)")
    input_tokens: int | None = Field(description="as usage.prompt_tokens")


class RerankMeta(BaseModel):
    """How the ranking was made."""

    method: str = Field(description="the method applied in every window")
    model: str = Field(description="the model id that answered")
    profile: dict[str, int] | None = Field(
        None, description="N -> the profile version used for windows of N (null: no profile)"
    )
    window: int = Field(description="the largest window size")
    seed: int = Field(description="the seed of the window assignment")
    rounds: int = Field(
        description="tournament rounds (1: every document in one window; 0: one document, "
        "trivially ranked first without a forward pass)"
    )
    windows: list[list[int]] = Field(description="window sizes of each round")
    forward_passes: int = Field(description="forward passes spent (perm_avg: N per window)")
    billed_units: RerankBilledUnits = Field(
        description="Cohere's meta.billed_units: images and input tokens (as usage)"
    )
    timings_ms: dict[str, float] = Field(
        description="per stage, the keys of POST /v1/retrieve's timings_ms: decode (with its "
        "base64 part; the headers up front, then each batch of windows' pixels as its round "
        "runs, summed), queue, process, forward, score (the rounds' batches summed), debias "
        "(every window's and the tournament's), encode"
    )


class RerankResponse(BaseModel):
    id: str = Field(description='"rerank-" + the request id (X-Request-ID)')
    model: str = Field(description="the served model id that answered")
    usage: RerankUsage = Field(description="images, prompt tokens and forward passes spent")
    results: list[RerankResult] = Field(description="top_n documents, best first")
    meta: RerankMeta = Field(description="how the ranking was made and what it cost")

    def wire(self) -> dict[str, Any]:
        """The JSON answer: a result's ``document`` only where it is echoed, absent rather
        than null (LiteLLM's Cohere type refuses ``"document": null``; Cohere's API and
        vLLM's leave it out)."""
        bare = {i: {"document"} for i, r in enumerate(self.results) if r.document is None}
        return self.model_dump(mode="json", exclude={"results": bare} if bare else None)
