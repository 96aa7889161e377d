"""The output head restricted to the label tokens while labels are scored (DESIGN §2.1).

The restricted normalisation reads, at every kept position, the logits of a node's
choices only: a dozen tokens of a vocabulary of ~150k. The full head is a (V x H) product
per kept position; on a narrow model that is as much as a good part of the text model
(tiny Qwen2.5-VL, H = 64: ~7 ms a position on one core, next to a ~150 ms request), and
the folded forward keeps D + 1 positions. While a ``label_head`` context is active (per
thread, like the attention capture), the model's output head computes the rows of the
label tokens only, so its logits are (..., K) with column c holding token ``tokens[c]``:
the same dot products as the full head. Any elementwise step the model applies after its
head (e.g. soft-capping) applies to these columns alike; a model whose logits go through
something across the vocabulary after the head would not fit, and no served family does.

The wrapper is installed once per model (``install_label_head``) as the head's
``forward``: nn.Module hooks on the head (pre-hooks that cut positions) still run, and
with no context active it is the head's own forward. Where the head cannot be computed
row-wise (not an ``nn.Linear``, or its weight offloaded to the meta device), the model
returns full logits and ``LabelHead.take`` selects the label columns from them.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.nn import functional

_INSTALLED = "_lad_label_head"


class LabelHead:
    """One scoring's label tokens and how many restricted head calls ran since ``take``."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = tuple(sorted({int(t) for t in tokens}))
        self.columns = {token: c for c, token in enumerate(self.tokens)}
        self._ids: dict[torch.device, torch.Tensor] = {}
        self.restricted_calls = 0

    def ids(self, device: torch.device) -> torch.Tensor:
        if device not in self._ids:
            self._ids[device] = torch.tensor(self.tokens, dtype=torch.long, device=device)
        return self._ids[device]

    def take(self, logits: torch.Tensor) -> torch.Tensor:
        """The label columns (..., K) of what one model call returned: as they are when the
        restricted head ran during it, else selected from the full logits (..., V)."""
        restricted, self.restricted_calls = self.restricted_calls > 0, 0
        if restricted:
            return logits
        return logits.index_select(-1, self.ids(logits.device))


_ACTIVE: contextvars.ContextVar[LabelHead | None] = contextvars.ContextVar(
    "lad_label_head", default=None
)


def install_label_head(model: torch.nn.Module) -> bool:
    """Wrap the model's output head (idempotent); False where it has no ``nn.Linear`` head
    (then ``take`` always selects from full logits)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        return False
    if getattr(head, _INSTALLED, False):
        return True
    full_forward = head.forward  # the module's own, or accelerate's device-moving wrapper

    def forward(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        session = _ACTIVE.get()
        if session is None:
            return full_forward(hidden, *args, **kwargs)
        weight, bias = head.weight, head.bias
        if weight.device.type == "meta":  # offloaded: only the full forward loads it
            logits = full_forward(hidden, *args, **kwargs)
            out = logits.index_select(-1, session.ids(logits.device))
        else:
            ids = session.ids(weight.device)
            rows = None if bias is None else bias.index_select(0, ids)
            out = functional.linear(hidden.to(weight.device), weight.index_select(0, ids), rows)
        session.restricted_calls += 1
        return out

    head.forward = forward
    setattr(head, _INSTALLED, True)
    return True


@contextlib.contextmanager
def label_head(tokens: Sequence[int]) -> Iterator[LabelHead]:
    """Restrict the output head of every model call in the block to ``tokens``."""
    session = LabelHead(tokens)
    token = _ACTIVE.set(session)
    try:
        yield session
    finally:
        _ACTIVE.reset(token)
