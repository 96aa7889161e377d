"""Text generation on the runner's loaded model, for the cot and self_consistency baselines.

The score methods never generate (DESIGN §2.1); these two baselines must (§2.5): the
model writes its reasoning and a final "The answer is <label>", which
``lad_lab.eval.answers.parse_answer`` reads. Same model, same adapter, same images-first
prompt layout as the runner, through ``model.generate()``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig

from app.engine.interface import RetrievalItem
from app.engine.labels import DEFAULT_COT_PROMPT, LabelSpec, cot_prompt_text, resolve_labels
from app.engine.runner import Runner
from lad_lab.eval.answers import parse_answer


@dataclass
class Generation:
    """One instance's sampled answers: texts, parsed positions (None: unparseable), cost."""

    texts: list[str]
    answers: list[int | None]
    forward_passes: int
    latency_ms: float

    @property
    def unparseable(self) -> int:
        return sum(a is None for a in self.answers)


def generate_answers(
    runner: Runner,
    items: Sequence[RetrievalItem],
    labels: LabelSpec = "digits",
    *,
    template: str = DEFAULT_COT_PROMPT,
    samples: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 64,
    top_k: int | None = 0,
    top_p: float | None = 1.0,
    seed: int = 0,
    inherit: bool = False,
    eos: str = "ours",
) -> list[Generation]:
    """``samples`` generations per item of one batch (greedy when temperature is 0).

    Every decoding setting is passed explicitly and the checkpoint's generation_config is
    set aside for the call (``explicit_generation``): released checkpoints ship settings
    such as top_k=1, which would collapse the samples to one path. top_k = 0 and
    top_p = 1 filter nothing.

    ``forward_passes`` counts the model calls of each item's sequences (one per generated
    token and sample; the first includes the prompt). Sampling is seeded by ``seed`` so a
    run is reproducible on the same build and thread count.

    ``inherit`` (the authors' protocol): keep the checkpoint's generation_config and pass
    only the given settings (top_k / top_p None: not passed, so the checkpoint's apply).
    ``eos``: the end token passed to ``generate``: "ours" (the adapter's end of turn),
    "tokenizer" (the tokenizer's eos and pad) or "config" (none: the generation_config's).
    """
    if samples < 1 or (samples > 1 and temperature <= 0):
        raise ValueError("several samples need a temperature > 0; greedy gives one answer")
    adapter = runner.adapter
    label_lists = [resolve_labels(labels, len(item.images)) for item in items]
    prompts = [
        adapter.render(len(item.images), cot_prompt_text(item.query, names, template))
        for item, names in zip(items, label_lists, strict=True)
    ]
    start = time.perf_counter()
    batch = adapter.process(prompts, [list(i.images) for i in items])
    batch = batch.to(runner.device, runner.dtype)
    kwargs = {k: v for k, v in adapter.prompt_kwargs(batch).items() if k != "position_ids"}
    end = adapter.end_token_id()
    settings = decoding_settings(temperature, top_k, top_p, max_new_tokens, inherit=inherit)
    settings |= _end_tokens(adapter, eos)
    torch.manual_seed(seed)
    keep = nullcontext() if inherit else explicit_generation(runner.model)
    with torch.inference_mode(), keep:
        out = runner.model.generate(**kwargs, num_return_sequences=samples, **settings)
    new = out[:, batch.input_ids.shape[1] :]
    elapsed = (time.perf_counter() - start) * 1e3
    lengths = _lengths(new, end)
    texts = adapter.tokenizer.batch_decode(new, skip_special_tokens=True)
    results = []
    for i, names in enumerate(label_lists):
        rows = range(i * samples, (i + 1) * samples)
        results.append(
            Generation(
                texts=[texts[r].strip() for r in rows],
                answers=[parse_answer(texts[r], names) for r in rows],
                forward_passes=int(sum(lengths[r] for r in rows)),
                latency_ms=elapsed / len(items),
            )
        )
    return results


def decoding_settings(
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    max_new_tokens: int,
    *,
    inherit: bool = False,
) -> dict[str, Any]:
    """The keyword arguments of ``generate`` for one baseline: sampling at ``temperature``
    (> 0) with top-k / top-p, or greedy; every value set, none left to a config, unless
    ``inherit``: then a None top_k / top_p is left out (the checkpoint's value applies) and
    greedy passes temperature 1.0, as the authors' calls do."""
    if (
        max_new_tokens < 1
        or (top_k is not None and top_k < 0)
        or (top_p is not None and not 0 < top_p <= 1)
        or (not inherit and (top_k is None or top_p is None))
    ):
        raise ValueError("need max_new_tokens >= 1, top_k >= 0 and 0 < top_p <= 1")
    if temperature <= 0:  # greedy: the sampling filters do not apply
        greedy: dict[str, Any] = {"do_sample": False, "max_new_tokens": int(max_new_tokens)}
        return greedy | {"num_beams": 1} | ({"temperature": 1.0} if inherit else {})
    sampled: dict[str, Any] = {
        "do_sample": True,
        "temperature": float(temperature),
        "top_k": None if top_k is None else int(top_k),
        "top_p": None if top_p is None else float(top_p),
        "max_new_tokens": int(max_new_tokens),
        "num_beams": 1,
    }
    return {k: v for k, v in sampled.items() if v is not None}


def _end_tokens(adapter: Any, eos: str) -> dict[str, Any]:
    """eos_token_id / pad_token_id for ``generate`` (see ``generate_answers``)."""
    tokenizer = adapter.tokenizer
    if eos == "config":
        return {}
    if eos == "tokenizer":
        return {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    if eos != "ours":
        raise ValueError(f"unknown eos {eos!r}; use ours, tokenizer or config")
    end = adapter.end_token_id()
    pad = tokenizer.pad_token_id
    return {"eos_token_id": end, "pad_token_id": end if pad is None else pad}


@contextmanager
def explicit_generation(model: Any) -> Iterator[None]:
    """Set the model's generation_config aside (a plain ``GenerationConfig()``) for one call:
    transformers fills every unset value from it, so a checkpoint's min_p, repetition
    penalty or top_k would otherwise reach the baselines."""
    saved = getattr(model, "generation_config", None)
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


def _lengths(new_tokens: torch.Tensor, end: int) -> list[int]:
    """Generated tokens per sequence up to and including the first end token."""
    lengths = []
    for row in new_tokens.tolist():
        lengths.append(row.index(end) + 1 if end in row else len(row))
    return lengths
