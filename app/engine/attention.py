"""Capture of the last prompt row of post-softmax attention inside the SDPA path (DESIGN §2.2).

The text model runs under an attention implementation registered with
transformers' ``AttentionInterface`` as ``"lad_capture"``. It delegates every
call to transformers' own SDPA function (so outputs are bit-identical to
``"sdpa"``) and, only while a :func:`capture` context is active and only for the
layers in Λ, also computes one extra row

    A^(l,h)[t_q -> :] = softmax(q_{t_q} · Kᵀ · scaling + mask[t_q, :])

per head (grouped-query heads expanded by reshaping the query, not the keys),
averaged over heads. t_q is the last column by default, or a per-row query index
when the runner appends label tokens after the prompt (``app.engine.runner``).
Nothing of size T x T is materialised beyond the boolean mask transformers
already builds, and the model is never switched to eager.
The matching mask function is registered under the same name with
``AttentionMaskInterface``; without it transformers would silently build no
mask at all (padding ignored).

Capture state lives in a ``ContextVar``: per forward call and per thread, and
off by default, so the trie's cached decode steps never record anything.

Which capture a family uses is its adapter's ``capture`` (the profile fingerprint
records it). ``"sdpa"`` is the above. ``"eager_hook"`` is the fallback for models whose
attention bypasses ``AttentionInterface`` (remote code with its own attention classes):
the text model runs eager, and a forward hook on the attention module of every decoder
layer keeps, while a capture is active and only for the layers in Λ, the t_q row of the
(B, H, T, T) weights that layer returned, and drops the matrix at once, so at most one
layer's matrix is alive at any time. A forward pre-hook asks layers of Λ (and only
them) for their weights where the module takes an ``output_attentions`` argument
(attention classes written before transformers 4.48, whose SDPA class then runs its eager
code; where the model passes no mask, meaning causal to SDPA, the hook passes the causal
mask eager needs); the model itself is never asked for ``output_attentions``, so no
layer's weights reach the output.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from app.engine.adapter import FamilyAdapter
from app.method.methods import MethodConfig

CAPTURE_IMPLEMENTATION = "lad_capture"
SDPA_CAPTURE = "sdpa"
EAGER_HOOK_CAPTURE = "eager_hook"
CAPTURES: tuple[str, ...] = (SDPA_CAPTURE, EAGER_HOOK_CAPTURE)
"""The capture paths an adapter's ``capture`` may name (see the module docstring)."""
LAYER_START_FRACTION = 0.58
"""Λ starts at round(0.58 L) (DESIGN §2.2): the later layers, where image attention is read."""


class AttentionCapture:
    """Rows recorded during one prompt forward: layer index -> (B, S) head-mean attention.

    ``query_index`` (B,) names t_q per row; None means the last column.
    """

    def __init__(self, layers: Sequence[int], query_index: torch.Tensor | None = None) -> None:
        self.layers = frozenset(int(layer) for layer in layers)
        self.query_index = query_index
        self.rows: dict[int, torch.Tensor] = {}
        self.matrix_bytes = 0  # eager hook: the largest attention matrix a layer returned

    def note_matrix(self, weights: torch.Tensor) -> None:
        self.matrix_bytes = max(self.matrix_bytes, weights.numel() * weights.element_size())

    def wants(self, layer_idx: int | None) -> bool:
        return layer_idx is not None and layer_idx in self.layers and layer_idx not in self.rows

    def keep_row(self, layer_idx: int, weights: torch.Tensor) -> None:
        """Keep t_q's head-mean row of a layer's post-softmax weights (B, H, Q, S)."""
        rows, index = query_rows(weights, self.query_index)
        self.rows[layer_idx] = weights[rows, :, index, :].float().mean(dim=1)


_ACTIVE: contextvars.ContextVar[AttentionCapture | None] = contextvars.ContextVar(
    "lad_attention_capture", default=None
)


def query_rows(
    tensor: torch.Tensor, query_index: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, t_q) index pair selecting each batch row's query position of a (B, H, Q, ...)
    tensor, on its device: t_q = ``query_index`` per row, or the last column Q - 1."""
    batch, q_len = tensor.shape[0], tensor.shape[2]
    rows = torch.arange(batch, device=tensor.device)
    if query_index is None:
        return rows, torch.full((batch,), q_len - 1, dtype=torch.long, device=tensor.device)
    return rows, query_index.to(device=tensor.device, dtype=torch.long)


def last_row_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    query_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """Post-softmax attention of one query position per row, mean over heads: (B, S).

    query (B, H, Q, D); key (B, H_kv, S, D); attention_mask (B|1, 1|H, Q, S) bool
    (True = attend) or additive float, or None (plain causal); query_index (B,)
    long, the query position t_q of each row (default: the last, Q - 1). Only the
    B selected query rows and their mask rows are touched. Computed in float32.
    """
    batch, heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    rows, index = query_rows(query, query_index)
    # (B, H_kv, G, D) @ (B, H_kv, D, S): query heads h = kv * G + g share key head kv
    q_row = query[rows, :, index, :].float().reshape(batch, kv_heads, groups, dim)
    scores = torch.matmul(q_row, key.float().transpose(-1, -2)) * scale
    scores = scores.reshape(batch, heads, kv_len)
    if attention_mask is not None:
        mask_rows = rows if attention_mask.shape[0] == batch else torch.zeros_like(rows)
        mask_row = attention_mask[mask_rows, :, index, -kv_len:]  # (B, 1|H, S)
        if mask_row.dtype == torch.bool:
            scores = scores.masked_fill(~mask_row, float("-inf"))
        else:
            scores = scores + mask_row.float()
    elif query_index is not None:
        # plain causal: query q sees keys up to q + (S - Q)
        keys = torch.arange(kv_len, device=query.device)
        visible = keys[None, :] <= (index + (kv_len - q_len))[:, None]  # (B, S)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1).mean(dim=1)


def capture_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA attention, plus the t_q row for the layers in Λ while a capture is active."""
    session = _ACTIVE.get()
    layer_idx = getattr(module, "layer_idx", None)
    if session is not None and session.wants(layer_idx):
        with torch.no_grad():
            session.rows[layer_idx] = last_row_attention(
                query, key, attention_mask, scaling, session.query_index
            )
    return sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        **kwargs,
    )


def register_capture() -> str:
    """Register the attention and mask functions under ``CAPTURE_IMPLEMENTATION`` (idempotent)."""
    AttentionInterface.register(CAPTURE_IMPLEMENTATION, capture_attention_forward)
    AttentionMaskInterface.register(CAPTURE_IMPLEMENTATION, sdpa_mask)
    return CAPTURE_IMPLEMENTATION


def enable_capture(model: torch.nn.Module, adapter: FamilyAdapter) -> None:
    """Put the text model on the adapter's capture path; the vision tower stays on SDPA."""
    if adapter.capture == EAGER_HOOK_CAPTURE:
        model.set_attn_implementation(adapter.attn_implementation("eager", "sdpa"))
        install_row_hooks(adapter.attention_modules())
        return
    if adapter.capture != SDPA_CAPTURE:
        raise ValueError(f"unknown capture {adapter.capture!r}; use one of {CAPTURES}")
    register_capture()
    model.set_attn_implementation(adapter.attn_implementation(CAPTURE_IMPLEMENTATION, "sdpa"))


_HOOKED = "_lad_row_hooks"


def install_row_hooks(modules: Sequence[torch.nn.Module | None]) -> None:
    """The eager-hook capture: a pre-hook and a forward hook on the attention module of each
    decoder layer, ``modules[l]`` being layer l's (idempotent). Both return at once while
    no capture is active, so the cached label steps and the eager reference see plain
    eager attention."""
    for layer_idx, module in enumerate(modules):
        if module is None or getattr(module, _HOOKED, None) is not None:
            continue  # no softmax attention in this layer, or hooked already
        takes_flag = "output_attentions" in inspect.signature(module.forward).parameters
        handles = (
            module.register_forward_pre_hook(
                _ask_for_weights(layer_idx, takes_flag), with_kwargs=True
            ),
            module.register_forward_hook(_keep_row_and_drop(layer_idx)),
        )
        setattr(module, _HOOKED, handles)


def _ask_for_weights(layer_idx: int, takes_flag: bool) -> Any:
    def pre_hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        session = _ACTIVE.get()
        if not takes_flag or session is None:
            return None
        wanted = session.wants(layer_idx)
        kwargs = {**kwargs, "output_attentions": wanted}
        if wanted and kwargs.get("attention_mask") is None:
            # no mask means causal to such a module's SDPA path (is_causal); its eager code,
            # which this call falls back to, would attend to every key instead
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            kwargs["attention_mask"] = causal_mask(hidden, kwargs.get("past_key_value"), layer_idx)
        return args, kwargs

    return pre_hook


def causal_mask(hidden: torch.Tensor, cache: Any, layer_idx: int) -> torch.Tensor:
    """Additive (1, 1, Q, P + Q) causal mask for ``hidden`` (B, Q, D) after P cached keys."""
    past = int(cache.get_seq_length(layer_idx)) if cache is not None else 0
    q_len = hidden.shape[1]
    keys = torch.arange(past + q_len, device=hidden.device)
    queries = torch.arange(q_len, device=hidden.device)[:, None] + past
    blocked = torch.full((), torch.finfo(hidden.dtype).min, dtype=hidden.dtype)
    mask = torch.where(keys[None, :] > queries, blocked.to(hidden.device), 0.0)
    return mask.to(hidden.dtype)[None, None]


def _keep_row_and_drop(layer_idx: int) -> Any:
    def hook(module: torch.nn.Module, args: tuple, output: Any) -> Any:
        session = _ACTIVE.get()
        if session is None or not isinstance(output, tuple) or len(output) < 2:
            return None
        weights = output[1]
        if not isinstance(weights, torch.Tensor):
            return None
        if session.wants(layer_idx):
            with torch.no_grad():
                session.keep_row(layer_idx, weights)
        session.note_matrix(weights)
        return (output[0], None, *output[2:])  # the matrix goes now, not at the layer's end

    return hook


def eager_attentions(
    model: torch.nn.Module, adapter: FamilyAdapter, batch: Any, **kwargs: Any
) -> tuple[torch.Tensor, ...]:
    """The reference the capture is checked against (the tests, ``lad bench attention``):
    the prompt forward on eager attention with ``output_attentions``, a (B, H, T, T) matrix
    per decoder layer (None for a layer without softmax attention, e.g. a linear-attention
    layer of a hybrid model, which reports nothing). The capture path is restored afterwards."""
    model.set_attn_implementation(adapter.attn_implementation("eager", "sdpa"))
    try:
        with torch.inference_mode():
            out = model(**adapter.prompt_kwargs(batch), output_attentions=True, **kwargs)
    finally:
        enable_capture(model, adapter)
    attentions, layers = tuple(out.attentions), adapter.attention_layers()
    if len(attentions) == len(layers) < adapter.num_layers():  # only softmax layers report
        by_layer = dict(zip(layers, attentions, strict=True))
        return tuple(by_layer.get(layer) for layer in range(adapter.num_layers()))
    return attentions


def span_mass(
    attentions: Sequence[torch.Tensor],
    row: int,
    t_q: int,
    layers: Sequence[int],
    spans: Sequence[tuple[int, int]],
) -> np.ndarray:
    """(|Λ|, N) a_k^(l) of §2.2 from full attention matrices: the head-mean attention of
    position ``t_q`` of ``row``, summed over each image span."""
    return np.array(
        [
            [float(attentions[layer][row, :, t_q, s:e].double().mean(0).sum()) for s, e in spans]
            for layer in layers
        ]
    )


def default_layers(
    num_layers: int,
    start_fraction: float = LAYER_START_FRACTION,
    attention_layers: Sequence[int] | None = None,
    min_layers: int = MethodConfig.top_k,
) -> tuple[int, ...]:
    """Λ = round(start_fraction * L) .. L-1 (DESIGN §2.2), among the ``attention_layers``.

    ``attention_layers`` (default: all L) are the layers whose softmax attention covers the
    whole prompt (``FamilyAdapter.attention_layers``): a hybrid model's sliding-window or
    linear-attention layers cannot attend to every image. Rule: Λ = that range intersected
    with ``attention_layers``; if this leaves fewer than ``min_layers`` (K, the layers L*
    keeps), Λ is the last ``min_layers`` of them instead (all of them if there are fewer).
    """
    if num_layers < 1:
        raise ValueError("num_layers must be >= 1")
    allowed = None if attention_layers is None else sorted({int(x) for x in attention_layers})
    if allowed is not None and (not allowed or not 0 <= allowed[0] <= allowed[-1] < num_layers):
        raise ValueError(
            f"the layers with softmax attention over the whole prompt, {allowed}, are not a "
            "non-empty subset of 0..L-1"
        )
    start = min(round(start_fraction * num_layers), num_layers - 1)
    chosen = tuple(range(start, num_layers))
    if allowed is None:
        return chosen
    kept = tuple(layer for layer in chosen if layer in allowed)
    return kept if len(kept) >= min_layers else tuple(allowed[-min_layers:])


@contextlib.contextmanager
def capture(
    layers: Sequence[int], query_index: torch.Tensor | None = None
) -> Iterator[AttentionCapture]:
    """Record the t_q attention row of ``layers`` during the forward calls inside the block.

    ``query_index`` (B,) gives t_q per row when it is not the last column.
    """
    session = AttentionCapture(layers, query_index)
    token = _ACTIVE.set(session)
    try:
        yield session
    finally:
        _ACTIVE.reset(token)


def aggregate_spans(
    session: AttentionCapture,
    layers: Sequence[int],
    spans: Sequence[Sequence[tuple[int, int]]],
) -> list[np.ndarray]:
    """a_k^(l) = sum over t in R_k of the head-mean row; one (|Λ|, N_i) array per batch row."""
    missing = [layer for layer in layers if layer not in session.rows]
    if missing:
        raise RuntimeError(
            f"no attention captured for layers {missing}; is the text model on "
            f"{CAPTURE_IMPLEMENTATION!r} attention?"
        )
    # with a device_map the rows come from each layer's device: gather them on the first's
    device = session.rows[layers[0]].device
    stacked = torch.stack([session.rows[layer].to(device) for layer in layers], dim=1)
    # prefix sums in float64, so a span sum is one subtraction without cancellation error
    cumulative = torch.nn.functional.pad(stacked.double().cumsum(dim=-1), (1, 0)).cpu().numpy()
    out: list[np.ndarray] = []
    for row, row_spans in enumerate(spans):
        starts = np.array([s for s, _ in row_spans], dtype=np.int64)
        ends = np.array([e for _, e in row_spans], dtype=np.int64)
        out.append(cumulative[row][:, ends] - cumulative[row][:, starts])
    return out
