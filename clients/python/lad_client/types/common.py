"""What several requests share: the strict base, the labels and the images fields, the
example images of the OpenAPI document.

Limits that depend on the server's settings (number of images, bytes, pixels, query length)
are checked by the server, whose errors name the setting; the shapes checked here are fixed.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from lad_client.vocabulary import MAX_N, SCHEMES

MAX_VERSION = 2**31 - 1
"""The largest profile version a request may name."""

LABELS_DESCRIPTION = (
    'label scheme ("digits", "upper", "lower", "roman", "words") or an explicit list of N '
    "distinct labels"
)
LABELS_JSON_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "enum": list(SCHEMES)},
        {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 32},
            "minItems": 2,
            "maxItems": MAX_N,
            "uniqueItems": True,
        },
    ],
    "default": "digits",
    "description": LABELS_DESCRIPTION,
}
"""What `labels` accepts (the limits are patched to the running settings in the OpenAPI
document); the service checks it itself, so a bad value answers 422 invalid_labels."""

LabelsValue = Annotated[str | list[str], WithJsonSchema(LABELS_JSON_SCHEMA)]
"""A labels value as sent (a scheme name or the N labels); the service resolves it into
``app.engine.labels.Labels``."""
ImageList = Annotated[
    list[str],
    Field(
        min_length=2,
        max_length=MAX_N,
        description="N >= 2 candidate images (at most LAD_MAX_IMAGES), each a "
        "data:image/...;base64, URL or bare base64 of a JPEG, PNG, WebP, GIF or BMP",
    ),
]


# Three 32 x 32 PNGs (a red circle, a green square, a blue triangle): the examples of the
# OpenAPI document, valid input for "Try it out".
EXAMPLE_IMAGES: tuple[str, ...] = (
    (
        "iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAgUlEQVR42u1W2w3AIAiUS5foCO4/jCN0Av87QK1c"
        "oIQ0gU9zDzVyKHPOFllowVUG+QYHibt6fy6eY6hEUZ/pUpq3gVNdxcCpriLhV9/j8Yn6hpXRB7btv3ErKsogxIDJ"
        "SD74kq7IdoglC7aU5/EwTxISCc+0YjBC/uwCZ3J18u8Nbog+MrtWHm33AAAAAElFTkSuQmCC"
    ),
    (
        "iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAPUlEQVR42mP8+vUrAy0BEwONwagFI8ACFqyimqvd"
        "yTPueujO0TgYtWDUglELRi0YtWBYWsA42rIbtYBiAACqRwj/SUU4RgAAAABJRU5ErkJggg=="
    ),
    (
        "iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAeUlEQVR42mP8+vUrAy0BEwONwagF1LfAOPD5UPYB"
        "xPkkeWIw+QDZ4cR7YtD4ANPJRHpicPgAl2OJ8cQg8AF+ZxL0xED7gJhQxq9mQH1AfHbFo3LgfEBquY9L/QD5gFTn"
        "49E1ED4gz/m49NLdB5Q4H6sJjKNt0wG3AAAaOyaawcmNfwAAAABJRU5ErkJggg=="
    ),
)


class Strict(BaseModel):
    """A request body: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")
