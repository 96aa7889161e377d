"""The image documents of POST /v1/rerank in the shapes common rerank APIs send them.

A document is an image given as a string (a ``data:image/...;base64,`` URL or bare base64,
Cohere's shape), as Cohere's object ``{"text": ...}`` (the string in its text field), as
Jina's ``{"image": ...}``, as an OpenAI/vLLM content part
``{"type": "image_url", "image_url": {"url": ...}}`` or as vLLM's document
``{"content": [<one image_url part>]}``; the whole list may also be vLLM's
``{"content": [<parts>]}`` (each part one document). The string may also be an
``http(s)`` URL, which the service fetches only from the hosts its operator allows
(LAD_MEDIA_ALLOWED_DOMAINS; by default none).

``return_documents`` echoes each document in the shape Cohere, vLLM and the clients built
on them read (``{"text": ...}``) for a string, and as it was sent for an object.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import Field

from lad_client.types.common import Strict

IMAGE_DESCRIPTION = (
    "a data:image/...;base64, URL, bare base64, or an http(s) URL the service fetches from a "
    "host its operator allows (LAD_MEDIA_ALLOWED_DOMAINS; by default none)"
)


class ImageUrl(Strict):
    url: str = Field(description=IMAGE_DESCRIPTION)
    detail: str | None = Field(None, description="accepted for OpenAI compatibility; ignored")


class ImageUrlPart(Strict):
    """An OpenAI / vLLM content part holding one image."""

    type: Literal["image_url"] = Field(description='"image_url" (text parts are not scored)')
    image_url: ImageUrl = Field(description="the image, as its `url`")


class JinaImageDocument(Strict):
    """Jina's image document."""

    image: str = Field(description=IMAGE_DESCRIPTION)


class CohereDocument(Strict):
    """Cohere's object document (``rank_fields`` unset: the text field is ranked), here
    holding the image string."""

    text: str = Field(description=IMAGE_DESCRIPTION)


class ContentDocument(Strict):
    """vLLM's multimodal document: a content list of exactly one image part."""

    content: list[ImageUrlPart] = Field(
        min_length=1, max_length=1, description="one image_url part (the document's image)"
    )


Document = str | JinaImageDocument | CohereDocument | ImageUrlPart | ContentDocument
"""One candidate image, in any of the accepted shapes."""


class ContentDocuments(Strict):
    """vLLM's ``documents: {"content": [parts]}``: each image part is one document."""

    content: list[ImageUrlPart] = Field(
        min_length=1,
        description="the candidate images, one part each (at most LAD_MAX_RERANK_CANDIDATES)",
    )


def image_of(document: Document) -> str:
    """The image string (data URL or base64) a document carries."""
    if isinstance(document, str):
        return document
    if isinstance(document, JinaImageDocument):
        return document.image
    if isinstance(document, CohereDocument):
        return document.text
    if isinstance(document, ImageUrlPart):
        return document.image_url.url
    return document.content[0].image_url.url


SentDocument = dict[str, Any]
"""A document as ``return_documents`` echoes it: ``{"text": ...}`` for a string (Cohere's
and vLLM's answer; LiteLLM's Cohere type refuses a bare string), an object as it was sent."""


def as_sent(document: Document | bytes) -> SentDocument:
    """The document echoed in the shape the caller used (``return_documents``): a string
    as ``{"text": <it>}``, a multipart file part as ``{"text": <its bytes in base64>}``, an
    object as it was sent."""
    if isinstance(document, bytes):
        return {"text": base64.b64encode(document).decode("ascii")}
    if isinstance(document, str):
        return {"text": document}
    return document.model_dump(mode="json", exclude_unset=True)
