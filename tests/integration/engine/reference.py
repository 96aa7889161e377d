"""The label scores computed the slow, obvious way, to check the runner's trie scoring against."""

from __future__ import annotations

import numpy as np
import torch

from app.engine.interface import RetrievalItem
from app.engine.label_scoring import label_token_sequences
from app.engine.runner import Runner


def brute_force_scores(runner: Runner, item: RetrievalItem, labels: list[str]) -> np.ndarray:
    """Teacher-force prompt + label + end token in one full forward (no cache, no trie).

    At each prefix of c_j the restricted set is every next token of the labels that
    share the prefix, plus the end token when some label ends exactly there.
    """
    seqs = [tuple(s) for s in label_token_sequences(runner.processor, labels)]
    eos = runner.adapter.end_token_id()
    batch = runner.process([item], labels)
    kwargs = dict(batch.inputs)
    scores = np.zeros(len(labels))
    for j, seq in enumerate(seqs):
        continuation = [*seq, eos]
        extra = torch.tensor([continuation])
        full = dict(kwargs)
        for key, value in kwargs.items():  # token-level tensors: label tokens are text
            if isinstance(value, torch.Tensor) and value.shape == batch.input_ids.shape:
                full[key] = torch.cat([value, torch.zeros_like(extra)], dim=1)
        full["input_ids"] = torch.cat([kwargs["input_ids"], extra], dim=1)
        full["attention_mask"] = torch.ones_like(full["input_ids"])
        with torch.inference_mode():
            logits = runner.model(**full).logits[0].double()
        start = kwargs["input_ids"].shape[1] - 1
        for d, token in enumerate(continuation):
            prefix = seq[:d]
            choices = {s[d] for s in seqs if s[:d] == prefix and len(s) > d}
            if prefix in seqs and choices:
                choices.add(eos)
            if d == len(seq) and not choices:
                break  # a leaf: nothing to normalise
            if len(choices) < 2:
                continue
            ids = sorted(choices)
            logp = torch.log_softmax(logits[start + d, ids], dim=-1)
            scores[j] += float(logp[ids.index(token)])
    return scores
