"""Helpers shared by the HTTP tests: image encodings, request bodies, wrapped runners."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Sequence
from typing import Any

from PIL import Image

from lad_lab.demo.world import RetrievalExample


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def b64(image: Image.Image) -> str:
    """Bare base64 of a PNG."""
    return base64.b64encode(png_bytes(image)).decode("ascii")


def data_url(image: Image.Image, fmt: str = "JPEG") -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    mime = "jpeg" if fmt == "JPEG" else fmt.lower()
    return f"data:image/{mime};base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def retrieve_body(item: RetrievalExample, **extra: Any) -> dict[str, Any]:
    return {"query": item.query, "images": [b64(img) for img in item.images], **extra}


def multipart_files(images: Sequence[Image.Image]) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("images", (f"{i}.png", png_bytes(img), "image/png")) for i, img in enumerate(images)]


def calibration_body(items: Sequence[RetrievalExample], **extra: Any) -> dict[str, Any]:
    examples = [
        {"query": it.query, "images": [b64(img) for img in it.images], "answer": it.target}
        for it in items
    ]
    return {"examples": examples, **extra}


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text (None when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        got = {}
        if "{" in head:
            for part in head[head.index("{") + 1 : head.rindex("}")].split('",'):
                key, _, val = part.partition("=")
                got[key.strip(",")] = val.strip('"')
        if all(got.get(k) == v for k, v in labels.items()):
            return float(value)
    return None


class GatedRunner:
    """The real runner behind a gate: forward waits until the test opens it (queue tests)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.items_run = 0  # forward passes (instances) that reached the model

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, items: Sequence[Any], labels: Any = "digits") -> Any:
        self.entered.set()
        if not self.gate.wait(30):
            raise TimeoutError("gate never opened")
        self.items_run += len(items)
        return self.inner.forward(items, labels=labels)


class FaultyRunner:
    """The real runner, except that a query of "boom" makes forward raise (worker tests)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, items: Sequence[Any], labels: Any = "digits") -> Any:
        if any(item.query == "boom" for item in items):
            raise RuntimeError("simulated failure inside the model")
        return self.inner.forward(items, labels=labels)
