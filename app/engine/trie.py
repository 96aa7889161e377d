"""Restricted trie scoring of the labels: s_j = log P(c_j | x) (DESIGN §2.1).

The labels' token sequences form a trie; at every node the next-token logits are
normalised over that node's children only (plus EOS where a label ends at an inner
node), so that sum_j exp(s_j) = 1 exactly. Nodes below the root are scored through a
caller-supplied ``step`` function, one batched call per trie depth (the runner serves
it from the prompt's KV cache, or, when the branching nodes form one chain, from
logits of the same prompt forward).

Model-agnostic: the runner owns the model and the cache and hands in ``root_logits``
and ``step``; this module only does the bookkeeping and the float64 log-space
arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

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
