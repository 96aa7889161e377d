"""The encoder cache: each distinct image (or tile) through the vision tower once per replica.

What the language model consumes of an image, its embeddings after the projector, depends
only on that image's preprocessed pixels (and its grid or size), the model's weights and
config, and the tower's dtype and attention kernel: the served families' towers encode
each unit independently of its neighbours and of its position in the prompt
(``app.engine.encoder_split``). So perm_avg's N orderings of the same images, a rerank
tournament's rounds and candidates that recur across requests can reuse the numbers.

During the runner's prompt forward, :meth:`EncoderCache.serving` puts a caching wrapper in
front of the model's ``get_image_features``: the call is split per unit by the adapter's
split, each unit is keyed, hits come from an LRU bounded in bytes
(``LAD_ENCODER_CACHE_MB``; 0 turns it off), the misses are encoded in ONE call on their
subset, and the output is put back together in the call's order.

A unit's key holds the model fingerprint, the split, the call's other arguments and the
unit's small tensors (grid or size rows), and either
* its image's content id (``app.engine.image_identity``: a digest of the decoded image's
  bytes, once per image object) with the preprocessing fingerprint and its pixel slice's
  shape and dtype, where the split's units are the call's images in order and the call
  holds the batch's images (each, or each distinct object once: the adapter's own sharing
  of repeated images); a miss then costs no pass over the float32 pixels; or
* a hash of its own pixel slice's bytes (tiles, images that are not PIL images, calls
  that cover other images): the preprocessed pixels reflect every preprocessing setting.

Bypassed (the call runs as it is): families whose adapter names no split, models whose
forward reads anything of the image features but ``pooler_output`` and
``deepstack_features`` (checked once in its source), and calls that do not have the
split's shape.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from app.engine.encoder_split import (
    CACHED_FIELDS,
    EncoderSplit,
    Features,
    Layout,
    Part,
)
from app.engine.image_identity import content_ids, distinct_objects

log = logging.getLogger(__name__)

MB = 1024 * 1024
_METHOD = "get_image_features"
_READS = re.compile(r"""mm_encoder_outputs\[["']image["']\]\.(\w+)""")
_UNKEYED = frozenset({"return_dict"})


@dataclass
class CacheStats:
    """Counters since the cache was made (the metrics read them at scrape time)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bypassed: int = 0  # get_image_features calls that ran uncached (no split for them)
    by_pixels: int = 0  # units keyed by their pixels' bytes (no image identity for them)


@dataclass(frozen=True)
class _Call:
    """What one ``serving`` block's wrapper knows about the calls it sees."""

    split: EncoderSplit
    n_images: int
    images: tuple[Any, ...]
    preprocessing: str
    owner: int  # id of the model's encoder owner


@dataclass(frozen=True)
class _Entry:
    features: Features
    nbytes: int


def _nbytes(features: Features) -> int:
    return sum(t.numel() * t.element_size() for t in features)


def _update(digest: Any, tensor: torch.Tensor) -> None:
    """Hash a tensor's dtype, shape and bytes (any dtype: its bytes are viewed as uint8)."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    digest.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
    digest.update(memoryview(flat.view(torch.uint8).numpy()))


def reads_only_cached_fields(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` reads nothing of its image features but the fields the
    cache gives back (read from its source; False when the source cannot be read)."""
    return _reads_only_cached_fields(type(model))


@functools.cache
def _reads_only_cached_fields(cls: type) -> bool:
    """Per class, once: reading a source file costs tens of milliseconds."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    reads = set(_READS.findall(source))
    return bool(reads) and reads <= CACHED_FIELDS


def encoder_owner(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module whose forward calls ``self.get_image_features`` (the inner model of a
    ``...ForConditionalGeneration``, else the model itself); None when there is none."""
    for owner in (getattr(model, "model", None), model):
        if owner is not None and callable(getattr(owner, _METHOD, None)):
            return owner
    return None


class EncoderCache:
    """An LRU of per-unit image embeddings bounded in bytes, shared by one runner's calls.

    ``fingerprint`` names what else changes the numbers (model config and weights hashes,
    dtype, the vision attention kernel); it is part of every key. Thread-safe."""

    def __init__(self, capacity_mb: float, fingerprint: str = "") -> None:
        if capacity_mb < 0:
            raise ValueError("the encoder cache's capacity must be >= 0 MB")
        self.capacity_bytes = int(capacity_mb * MB)
        self.fingerprint = fingerprint
        self.stats = CacheStats()
        self.bytes = 0
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._layouts: dict[int, Layout] = {}  # per model (id of its encoder owner)
        self._refused: set[int] = set()  # models whose output turned out not per unit
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def snapshot(self) -> dict[str, int]:
        """Counters and size, for the metrics (``lad_encoder_cache_*``)."""
        with self._lock:
            return {
                "hits": self.stats.hits,
                "misses": self.stats.misses,
                "evictions": self.stats.evictions,
                "bypassed": self.stats.bypassed,
                "bytes": self.bytes,
                "capacity_bytes": self.capacity_bytes,
                "entries": len(self._entries),
            }

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    # ---- the LRU ---------------------------------------------------------------------
    def get(self, key: bytes) -> Features | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry.features

    def put(self, key: bytes, features: Features) -> None:
        """Keep ``features`` (copied: a view would hold its whole batch's output), evicting
        least recently used entries until it fits; one larger than the bound is not kept."""
        size = _nbytes(features)
        if size > self.capacity_bytes:
            return
        kept = tuple(t.detach().clone() for t in features)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            while self._entries and self.bytes + size > self.capacity_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.bytes -= evicted.nbytes
                self.stats.evictions += 1
            self._entries[key] = _Entry(kept, size)
            self.bytes += size

    def key(self, part: Part, shared: dict[str, Any], split: str) -> bytes:
        """The unit's key by its pixels: its own tensors' bytes, the call's other
        arguments, the split and the model fingerprint."""
        digest = hashlib.sha256()  # SHA extensions: ~2.5x blake2b here
        digest.update(f"{self.fingerprint}|{split}|{sorted(shared.items())!r}".encode())
        for name in sorted(part):
            digest.update(name.encode())
            _update(digest, part[name])
        return digest.digest()

    def image_key(
        self,
        identity: bytes,
        part: Part,
        shared: dict[str, Any],
        split: str,
        pixels: str,
        preprocessing: str,
        piece: int = 0,
    ) -> bytes:
        """The unit's key by its image: the image's content id, the unit's index within
        it, the preprocessing fingerprint, the pixel slice's dtype and shape (not its
        bytes), the unit's other tensors' bytes, the call's other arguments, the split and
        the model fingerprint."""
        digest = hashlib.sha256()
        head = f"{self.fingerprint}|{split}|{sorted(shared.items())!r}|{preprocessing}|{piece}|"
        digest.update(head.encode())
        digest.update(identity)
        for name in sorted(part):
            tensor = part[name]
            digest.update(name.encode())
            if name == pixels:
                digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
            else:
                _update(digest, tensor)
        return digest.digest()

    def _keys(
        self,
        parts: list[Part],
        shared: dict[str, Any],
        split: EncoderSplit,
        images: Sequence[Any],
        preprocessing: str,
    ) -> list[bytes]:
        """Each unit's key: by its image where the units are the batch's images (all, or
        each distinct object once), else by its pixels."""
        pixels = split.image_pixels
        ids = None
        if pixels is not None and images:
            if len(parts) == len(images):
                ids = content_ids(images)
            elif len(parts) == len(distinct := distinct_objects(images)):
                ids = content_ids(distinct)
        if ids is None:
            self.stats.by_pixels += len(parts)
            return [self.key(p, shared, split.name) for p in parts]
        return [
            self.image_key(i, p, shared, split.name, pixels, preprocessing)
            for i, p in zip(ids, parts, strict=True)
        ]

    # ---- the wrapper -------------------------------------------------------------------
    @contextmanager
    def serving(
        self,
        model: torch.nn.Module,
        split: EncoderSplit | None,
        n_images: int,
        images: Sequence[Any] = (),
        preprocessing: str | Callable[[], str] = "",
    ) -> Iterator[None]:
        """Within the block, ``model``'s image features go through the cache (nothing
        changes when the cache is off, ``split`` is None or the model cannot use it).

        ``images``: the batch's decoded images in the processor's order (their content ids
        key the units; none given: every unit is keyed by its pixels); ``preprocessing``:
        the processor's settings fingerprint (or what computes it, called once here)."""
        owner = encoder_owner(model) if self.enabled and split is not None else None
        if owner is None or split is None or not reads_only_cached_fields(owner):
            yield
            return
        original = getattr(owner, _METHOD)
        signature = inspect.signature(original)
        setting = preprocessing() if callable(preprocessing) else preprocessing
        context = _Call(split, n_images, tuple(images), setting, id(owner))

        def cached(*args: Any, **kwargs: Any) -> Any:
            return self._call(original, _named(signature, args, kwargs), context)

        setattr(owner, _METHOD, cached)
        try:
            yield
        finally:
            delattr(owner, _METHOD)  # the class's own method again

    def _call(self, original: Callable[..., Any], arguments: dict[str, Any], at: _Call) -> Any:
        split, owner = at.split, at.owner
        parts = None if owner in self._refused else split.split(arguments, at.n_images)
        shared = {k: v for k, v in arguments.items() if parts and k not in parts[0]}
        keyed = {k: v for k, v in shared.items() if k not in _UNKEYED}
        if not parts or any(isinstance(v, torch.Tensor) for v in keyed.values()):
            self.stats.bypassed += 1
            return original(**arguments)
        keys = self._keys(parts, keyed, split, at.images, at.preprocessing)
        found: dict[bytes, Features] = {}
        for key in keys:
            hit = found.get(key) if key in found else self.get(key)
            if hit is not None:
                found[key] = hit
        todo = list(dict.fromkeys(k for k in keys if k not in found))
        self.stats.hits += len(keys) - len(todo)
        self.stats.misses += len(todo)
        layout = self._layouts.get(owner)
        if todo:
            every = split.whole and len(todo) == len(keys)  # all distinct misses: the call
            first = {k: keys.index(k) for k in todo}
            subset = (
                arguments if every else {**shared, **split.join([parts[first[k]] for k in todo])}
            )
            output = original(**subset)
            cut = split.unit_output(output, len(todo))
            if cut is None:  # not a per-unit output: this model runs uncached from now on
                log.warning("encoder cache: %s output is not per unit; bypassing", split.name)
                self._refused.add(owner)
                return output if len(todo) == len(keys) else original(**arguments)
            features, layout = cut
            self._layouts[owner] = layout
            for key, unit in zip(todo, features, strict=True):
                found[key] = unit
                self.put(key, unit)
            if every:  # nothing to put back together
                return output
        if layout is None:  # hits without a layout: only after clear() raced a call
            return original(**arguments)
        return split.assemble([found[k] for k in keys], layout, arguments)


def _named(signature: inspect.Signature, args: Sequence[Any], kwargs: dict[str, Any]) -> dict:
    """The call's arguments by name (the ``**kwargs`` catch-all flattened in)."""
    bound = signature.bind(*args, **kwargs)
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            raise TypeError(f"{_METHOD} takes no positional catch-all")
        else:
            named[name] = value
    return named
