"""An image's content identity, and the fingerprint of the settings that preprocess it.

The encoder cache keys an image's embeddings by what determines them. Hashing the
preprocessed float32 pixels does that but costs about as much as a small vision tower (the
patches hold every pixel several times over, in 4 bytes each), and it is paid again for
every ordering, window and request. The decoded image's own bytes determine those pixels
once the preprocessing settings are fixed, so an image is keyed by a digest of its raw
bytes, size and mode (its palette where it has one), computed once per image object and
kept on it (perm_avg's orderings and a tournament's rounds share the decoded objects), plus
a fingerprint of the image processor's configuration, computed per call (a change to the
processor's settings changes every key from the next forward on).

The identity kept on an object assumes the image is not drawn on after it is first keyed;
the service decodes each upload into a fresh image and never changes it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from PIL import Image

_KEPT = "_lad_content_id"


def content_id(image: Any) -> bytes | None:
    """sha256 of a PIL image's mode, size, palette and raw bytes, once per object; None for
    anything that is not a PIL image (its units are then keyed by their pixels)."""
    if not isinstance(image, Image.Image):
        return None
    kept = getattr(image, _KEPT, None)
    if kept is not None:
        return kept
    digest = hashlib.sha256(f"{image.mode}|{image.size}|".encode())
    if image.mode in ("P", "PA"):
        digest.update(bytes(image.getpalette() or ()))
        digest.update(repr(image.info.get("transparency")).encode())
    digest.update(image.tobytes())
    identity = digest.digest()
    setattr(image, _KEPT, identity)
    return identity


def content_ids(images: Sequence[Any]) -> list[bytes] | None:
    """Each image's content id, in order; None when any has none."""
    ids = [content_id(image) for image in images]
    return None if any(i is None for i in ids) else ids  # type: ignore[return-value]


def distinct_objects(images: Sequence[Any]) -> list[Any]:
    """The images with repeated objects left out, in order of first appearance (what an
    adapter that shares repeated images within a batch hands its vision tower)."""
    seen: dict[int, Any] = {}
    for image in images:
        seen.setdefault(id(image), image)
    return list(seen.values())


def preprocessing_fingerprint(processor: Any) -> str:
    """sha256 of the image processor's public settings (the processor's own when it has no
    separate image processor); "" when it has none to read. Private attributes are left
    out: they hold what was derived from the settings (e.g. a value table kept with its
    key), not settings, and printing them would cost more than the key saves."""
    source = getattr(processor, "image_processor", None) or processor
    settings = getattr(source, "__dict__", None)
    if not settings:
        return ""
    public = {k: v for k, v in settings.items() if not k.startswith("_")}
    config = json.dumps(public, sort_keys=True, default=repr)
    return hashlib.sha256(f"{type(source).__name__}|{config}".encode()).hexdigest()[:16]
