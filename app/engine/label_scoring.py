"""Scoring the labels over the model's logits: s_j = log P(c_j | x) (DESIGN §2.1).

The label trie: the labels' token sequences form a trie; at every node the next-token
logits are normalised over that node's children only (plus EOS where a label ends at an
inner node), so that sum_j exp(s_j) = 1 exactly. Nodes below the root are scored through a
caller-supplied ``step`` function, one batched call per trie depth (the runner serves it
from the prompt's KV cache, or, when the branching nodes form one chain, from logits of the
same prompt forward: the fold). The float64 log-space arithmetic is here; the runner owns
the model and the cache and hands in ``root_logits`` and ``step``.

The label head: the restricted normalisation reads, at every kept position, the logits of
a node's choices only: a dozen tokens of a vocabulary of ~150k. The full head is a (V x H)
product per kept position; on a narrow model that is as much as a good part of the text
model (tiny Qwen2.5-VL, H = 64: ~7 ms a position on one core, next to a ~150 ms request),
and the folded forward keeps D + 1 positions. While a ``label_head`` context is active (per
thread, like the attention capture), the model's output head computes the rows of the
label tokens only, so its logits are (..., K) with column c holding token ``tokens[c]``:
the same dot products as the full head. Any elementwise step the model applies after its
head (e.g. soft-capping) applies to these columns alike; a model whose logits go through
something across the vocabulary after the head would not fit, and no served family does.
The wrapper is installed once per model (``install_label_head``) as the head's
``forward``: nn.Module hooks on the head (pre-hooks that cut positions) still run, and with
no context active it is the head's own forward. Where the head cannot be computed row-wise
(not an ``nn.Linear``, or its weight offloaded to the meta device), the model returns full
logits and ``LabelHead.take`` selects the label columns from them.

The fold (the runner's module docstring explains it): which tries fold (their branching
nodes below the root lie on one chain), the batch with each row's chain appended and
re-padded on the left, and the chain-prefix logits looked up from the one forward's kept
positions.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.nn import functional

from app.engine.adapter import PromptBatch

StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``step(rows, paths) -> logits``: rows LongTensor (R,) of batch-row indices, paths
LongTensor (R, d) of label tokens appended right after each row's prompt; returns the
next-token logits (R, V) after the last path token (never by re-running the prompt)."""


def label_token_sequences(tokenizer: Any, labels: Sequence[str]) -> list[list[int]]:
    """Token ids of each label as the model writes it right after the generation prompt.

    ``tokenizer`` may be a tokenizer or a processor holding one in ``.tokenizer``.
    """
    tok = getattr(tokenizer, "tokenizer", None)
    tok = tokenizer if tok is None else tok
    return [list(tok(label, add_special_tokens=False)["input_ids"]) for label in labels]


# ---------------------------------------------------------------- the label trie


@dataclass
class TrieNode:
    """One prefix of label tokens.

    ``choices`` is the restricted set normalised over at this node: the children's
    tokens in ascending order, then ``eos_id`` when a label ends here and the node
    also has children. A node with fewer than two choices is never scored (its
    restricted log-prob is 0).
    """

    path: tuple[int, ...]
    children: dict[int, int] = field(default_factory=dict)  # token -> node index
    label: int | None = None  # index of the label ending here
    choices: tuple[int, ...] = ()

    @property
    def depth(self) -> int:
        return len(self.path)

    @property
    def is_inner(self) -> bool:
        return bool(self.children)

    @property
    def is_branching(self) -> bool:
        """Whether the restricted distribution here is non-trivial (>= 2 choices)."""
        return len(self.choices) >= 2


@dataclass
class LabelTrie:
    """Trie of the labels' token sequences; ``nodes[0]`` is the root (empty path)."""

    nodes: list[TrieNode]
    eos_id: int
    token_sequences: list[tuple[int, ...]]
    label_steps: list[list[tuple[int, int]]]  # per label: (node index, choice index) along its path

    @classmethod
    def build(cls, token_sequences: Sequence[Sequence[int]], eos_id: int) -> LabelTrie:
        """Build the trie; labels must tokenise to distinct, non-empty sequences without EOS."""
        seqs = [tuple(int(t) for t in s) for s in token_sequences]
        if not seqs:
            raise ValueError("need at least one label")
        seen: dict[tuple[int, ...], int] = {}
        for j, seq in enumerate(seqs):
            if not seq:
                raise ValueError(f"label {j} tokenises to nothing")
            if eos_id in seq:
                raise ValueError(f"label {j} contains the end-of-sequence token {eos_id}")
            if seq in seen:
                raise ValueError(f"labels {seen[seq]} and {j} tokenise identically: {list(seq)}")
            seen[seq] = j
        nodes = [TrieNode(path=())]
        for j, seq in enumerate(seqs):
            at = 0
            for d, tok in enumerate(seq):
                if tok not in nodes[at].children:
                    nodes[at].children[tok] = len(nodes)
                    nodes.append(TrieNode(path=seq[: d + 1]))
                at = nodes[at].children[tok]
            nodes[at].label = j
        for node in nodes:
            ends_inside = node.label is not None and node.is_inner
            node.choices = tuple(sorted(node.children)) + ((eos_id,) if ends_inside else ())
        label_steps = []
        for seq in seqs:
            steps, at = [], 0
            for tok in seq:
                steps.append((at, nodes[at].choices.index(tok)))
                at = nodes[at].children[tok]
            if nodes[at].is_inner:
                steps.append((at, len(nodes[at].choices) - 1))  # the EOS choice
            label_steps.append(steps)
        return cls(nodes=nodes, eos_id=eos_id, token_sequences=seqs, label_steps=label_steps)

    @classmethod
    def from_labels(cls, tokenizer: Any, labels: Sequence[str], eos_id: int) -> LabelTrie:
        """Tokenise ``labels`` (see ``label_token_sequences``) and build their trie."""
        return cls.build(label_token_sequences(tokenizer, labels), eos_id)

    @property
    def n_labels(self) -> int:
        return len(self.token_sequences)

    @property
    def root(self) -> TrieNode:
        return self.nodes[0]

    def node(self, path: Sequence[int]) -> TrieNode:
        """The node reached by ``path`` (KeyError if no label starts with it)."""
        at = 0
        for tok in path:
            at = self.nodes[at].children[int(tok)]
        return self.nodes[at]

    def branching_nodes(self, depth: int) -> list[int]:
        """Indices of the nodes at ``depth`` that need a restricted log-softmax."""
        return [i for i, nd in enumerate(self.nodes) if nd.depth == depth and nd.is_branching]

    @property
    def max_depth(self) -> int:
        return max(len(s) for s in self.token_sequences)

    @property
    def choice_tokens(self) -> frozenset[int]:
        """Every token a branching node normalises over: the only logits scoring reads."""
        return frozenset(t for node in self.nodes if node.is_branching for t in node.choices)


# ---------------------------------------------------------------- batched scoring


def _restricted_log_softmax(
    logits: torch.Tensor, choices: Sequence[Sequence[int]], columns: Mapping[int, int] | None
) -> list[np.ndarray]:
    """Row r: float64 log-softmax of logits[r] over the token ids choices[r] only; token t
    is column ``columns[t]`` of ``logits`` (column t when ``columns`` is None)."""
    width = max(len(c) for c in choices)
    index = torch.zeros((len(choices), width), dtype=torch.long)
    valid = torch.zeros((len(choices), width), dtype=torch.bool)
    for r, c in enumerate(choices):
        cols = c if columns is None else [columns[t] for t in c]
        index[r, : len(c)] = torch.tensor(cols, dtype=torch.long)
        valid[r, : len(c)] = True
    picked = logits.gather(1, index.to(logits.device)).to(device="cpu", dtype=torch.float64)
    picked = picked.masked_fill(~valid, float("-inf"))
    logp = torch.log_softmax(picked, dim=-1).numpy()
    return [logp[r, : len(c)] for r, c in enumerate(choices)]


def score_label_tries(
    tries: Sequence[LabelTrie],
    root_logits: torch.Tensor,
    step: StepFn,
    columns: Mapping[int, int] | None = None,
) -> list[np.ndarray]:
    """Restricted label scores s (N_i,) float64 per batch row, in label order.

    ``root_logits`` (B, V) are the next-token logits at each row's last prompt
    position; ``tries[i]`` is row i's label trie. With ``columns``, the root and step
    logits hold some tokens only, token t in column ``columns[t]`` (every token of the
    tries' ``choice_tokens`` needs one). Depth 0 is scored from ``root_logits``; every
    deeper depth that has a branching node in any row costs exactly one ``step`` call
    covering all rows' nodes at that depth (nodes with a single choice have log-prob 0
    and are skipped). Each row satisfies
    sum_j exp(s_j) = 1.
    """
    if root_logits.ndim != 2 or root_logits.shape[0] != len(tries):
        raise ValueError(
            f"root_logits must be (B, V) with B = len(tries) = {len(tries)}, "
            f"got {tuple(root_logits.shape)}"
        )
    node_logp: list[dict[int, np.ndarray]] = [{} for _ in tries]
    max_depth = max((t.max_depth for t in tries), default=0)
    for depth in range(max_depth):
        requests = [(i, k) for i, trie in enumerate(tries) for k in trie.branching_nodes(depth)]
        if not requests:
            continue
        choices = [tries[i].nodes[k].choices for i, k in requests]
        if depth == 0:
            rows = torch.tensor([i for i, _ in requests], device=root_logits.device)
            logits = root_logits.index_select(0, rows)
        else:
            rows = torch.tensor([i for i, _ in requests], dtype=torch.long)
            paths = torch.tensor([tries[i].nodes[k].path for i, k in requests], dtype=torch.long)
            logits = step(rows.to(root_logits.device), paths.to(root_logits.device))
            if logits.shape[0] != len(requests):
                raise ValueError(f"step returned {logits.shape[0]} rows for {len(requests)} paths")
        logps = _restricted_log_softmax(logits, choices, columns)
        for (i, k), logp in zip(requests, logps, strict=True):
            node_logp[i][k] = logp
    scores = []
    for i, trie in enumerate(tries):
        s = np.zeros(trie.n_labels, dtype=np.float64)
        for j, steps in enumerate(trie.label_steps):
            s[j] = sum(node_logp[i][k][c] for k, c in steps if trie.nodes[k].is_branching)
        scores.append(s)
    return scores


# ---------------------------------------------------------------- the label head
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


# ---------------------------------------------------------------- the fold
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

    ``logits`` (B, D + 1, V) (V: the columns the label head computed) are
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
