"""The folded forward's plumbing (design §2.1; the runner's module docstring explains the
fold): which tries fold (their branching nodes below the root lie on one chain), the
batch with each row's chain appended and re-padded on the left, and the chain-prefix
logits looked up from the one forward's kept positions."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from app.engine.adapter import PromptBatch
from app.engine.trie import LabelTrie, StepFn


def chain_path(trie: LabelTrie) -> tuple[int, ...] | None:
    """The path of the deepest branching node below the root, if every branching node
    below the root is a prefix of it (``()`` when there is none); else None (no fold)."""
    below = [trie.nodes[k] for d in range(1, trie.max_depth) for k in trie.branching_nodes(d)]
    if not below:
        return ()
    deepest = max(below, key=lambda node: node.depth).path
    if all(deepest[: node.depth] == node.path for node in below):
        return deepest
    return None


def fold_batch(
    batch: PromptBatch, chains: Sequence[tuple[int, ...]], pad_id: int
) -> tuple[PromptBatch, torch.Tensor]:
    """Append each row's chain tokens to its prompt, re-padded on the LEFT.

    Every (B, T) token-level tensor becomes (B, T + D) with D = the longest chain:
    row r gets D - d_r extra left pads (``pad_id`` in input_ids, 0 elsewhere, mask
    0), then its old row, then its d_r chain tokens (mask 1, token type 0 = text).
    Pixel inputs are unchanged. Returns the batch and t_q per row (B,): the index
    of the last prompt token, ``T + D - 1 - d_r``.
    """
    ids = batch.input_ids
    rows, width = ids.shape
    depth = max(len(c) for c in chains)
    inputs: dict[str, torch.Tensor] = {}
    for key, value in batch.inputs.items():
        if not (isinstance(value, torch.Tensor) and value.shape == ids.shape):
            inputs[key] = value
            continue
        fill = pad_id if key == "input_ids" else 0
        folded = value.new_full((rows, width + depth), fill)
        for r, chain in enumerate(chains):
            shift = depth - len(chain)
            folded[r, shift : shift + width] = value[r]
            if key == "input_ids":
                folded[r, shift + width :] = torch.tensor(
                    chain, dtype=value.dtype, device=value.device
                )
            elif key == "attention_mask":
                folded[r, shift + width :] = 1
        inputs[key] = folded
    lengths = torch.tensor([len(c) for c in chains], dtype=torch.long, device=ids.device)
    query_index = width + depth - 1 - lengths
    return PromptBatch(inputs, list(batch.n_images), dict(batch.extra), batch.images), query_index


def folded_scoring(
    logits: torch.Tensor, chains: Sequence[tuple[int, ...]]
) -> tuple[torch.Tensor, StepFn]:
    """Root logits (B, V) and a ``step`` that looks up chain-prefix logits; no forward.

    ``logits`` (B, D + 1, V) (V: the columns the head computed, ``app.engine.head``) are
    the kept last D + 1 positions of the folded forward: row r's t_q is kept column
    D - d_r and the logits after its chain prefix of length k are at column D - d_r + k.
    ``step`` only serves prefixes of the chain.
    """
    depth = logits.shape[1] - 1
    offsets = torch.tensor([depth - len(c) for c in chains], dtype=torch.long)
    rows_all = torch.arange(len(chains))
    root = logits[rows_all.to(logits.device), offsets.to(logits.device)]

    def step(rows: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        k = paths.shape[1]
        columns = []
        for r, path in zip(rows.tolist(), paths.tolist(), strict=True):
            if k > len(chains[r]) or tuple(path) != chains[r][:k]:
                raise RuntimeError(f"path {path} of row {r} is not on its folded chain")
            columns.append(int(offsets[r]) + k)
        cols = torch.tensor(columns, dtype=torch.long, device=logits.device)
        return logits[rows.to(logits.device), cols]

    return root, step
