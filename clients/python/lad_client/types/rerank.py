"""POST /v1/rerank: a query and many candidate images, ranked by windowed tournament."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from lad_client.types.common import EXAMPLE_IMAGES, Strict
from lad_client.types.documents import (
    ContentDocuments,
    Document,
    SentDocument,
    as_sent,
    image_of,
)
from lad_client.vocabulary import MAX_N, METHODS, NAME_PATTERN, SCHEMES, Method

RERANK_EXAMPLE: dict[str, object] = {
    "query": "a small green square",
    "documents": list(EXAMPLE_IMAGES),
    "top_n": 2,
    "return_documents": False,
    "method": "vanilla",
    "seed": 7,
}


DocumentList = Annotated[list[Document], Field(min_length=2, max_length=MAX_N)]


class RerankOptions(Strict):
    """How to rerank (shared by the JSON and the multipart encodings of POST /v1/rerank)."""

    top_n: int | None = Field(
        None,
        ge=1,
        le=MAX_N,
        description="results to return; the best top_n of each window "
        "advance (the winner and, for top_n > 1, runners-up). Unset: every document is "
        "returned, ranked, with only window winners advancing (the cheapest tournament)",
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
        le=MAX_N,
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
        description="echo each result's document as it was sent (a file part of a "
        "multipart body: its bytes in base64)",
    )
    model: str | None = Field(
        None,
        max_length=512,
        description="the served model id (GET /v1/models); another id "
        "is 404 model_not_found; unset: the served model",
    )


class RerankRequest(RerankOptions):
    """A query and its candidate images, in the shape common rerank APIs use."""

    model_config = ConfigDict(json_schema_extra={"examples": [RERANK_EXAMPLE]})

    query: str = Field(min_length=1, max_length=100_000, description="the caption to match")
    max_tokens_per_doc: int | None = Field(
        None,
        ge=1,
        description="Cohere v2's text truncation; accepted and ignored (an image "
        "document is never truncated)",
    )
    max_chunks_per_doc: int | None = Field(
        None, ge=1, description="Cohere v1's chunking of long texts; accepted and ignored"
    )
    documents: DocumentList | ContentDocuments = Field(
        description="2..LAD_MAX_RERANK_CANDIDATES candidate images, each a data:image/...;"
        'base64, URL or bare base64 string, Cohere\'s {"text": ...}, Jina\'s {"image": ...}, '
        "an image_url content part "
        '{"type": "image_url", "image_url": {"url": ...}} or vLLM\'s {"content": [<one image_url '
        'part>]}; or vLLM\'s {"content": [<image_url parts>]} (one document per part). Remote '
        "(http://, https://) URLs are not fetched: 400 invalid_image",
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
        """Each document as it was sent (for ``return_documents``)."""
        return [as_sent(d) for d in self.listed()]


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
        None, description="with return_documents: the document as it was sent; else null"
    )


class RerankUsage(BaseModel):
    """What the request cost."""

    images: int = Field(description="candidate images decoded")
    prompt_tokens: int | None = Field(
        description="tokens of every forward pass's prompt, images included, summed over the "
        "tournament (null if the engine does not report them)"
    )
    forward_passes: int = Field(description="forward passes spent (as meta.forward_passes)")


class RerankMeta(BaseModel):
    """How the ranking was made."""

    method: str = Field(description="the method applied in every window")
    model: str = Field(description="the model id that answered")
    profile: dict[str, int] | None = Field(
        None, description="N -> the profile version used for windows of N (null: no profile)"
    )
    window: int = Field(description="the largest window size")
    seed: int = Field(description="the seed of the window assignment")
    rounds: int = Field(description="tournament rounds (1: every document in one window)")
    windows: list[list[int]] = Field(description="window sizes of each round")
    forward_passes: int = Field(description="forward passes spent (perm_avg: N per window)")
    timings_ms: dict[str, float] = Field(
        description="per stage, the keys of POST /v1/retrieve's timings_ms: decode (with its "
        "base64 part), queue, process, forward, score (the rounds' batches summed), debias "
        "(every window's and the tournament's), encode"
    )


class RerankResponse(BaseModel):
    id: str = Field(description='"rerank-" + the request id (X-Request-ID)')
    model: str = Field(description="the served model id that answered")
    usage: RerankUsage = Field(description="images, prompt tokens and forward passes spent")
    results: list[RerankResult] = Field(description="top_n documents, best first")
    meta: RerankMeta = Field(description="how the ranking was made and what it cost")
