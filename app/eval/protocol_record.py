"""protocol.json: every setting that decides the numbers of one ``lad eval`` run (design §2.11).

Written before the first forward (and alone with ``--dry-run``, which needs no model): the
dataset and split, the items and calibration items, the orderings and perm_avg orders
themselves, the image preprocessing, every prompt byte for byte, the generation settings,
the methods and their forward passes. Two runs with equal protocol.json files (apart from
``command`` and ``written``) ran the same benchmark.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.engine.answers import cot_prompt_text
from app.engine.labels import resolve_labels
from app.engine.methods import METHODS, NEEDS_CALIBRATION
from app.engine.prompts import prompt_text
from app.eval.paper import paper_layers, spec, tile_cap

QUERY = "{query}"
"""Stands for the caption in the prompts written to protocol.json."""


def model_depth(model: str) -> int | None:
    """L of a local or cached model from its config alone (no weights); None if unknown."""
    from transformers import AutoConfig

    from app.models.loader import DEMO_MODEL_DIR

    try:
        config = AutoConfig.from_pretrained(
            str(DEMO_MODEL_DIR) if model == "demo" else model, local_files_only=True
        )
    except (OSError, ValueError):
        return None
    for sub in ("text_config", "llm_config"):
        inner = getattr(config, sub, None)
        if inner is not None and getattr(inner, "num_hidden_layers", None):
            return int(inner.num_hidden_layers)
    depth = getattr(config, "num_hidden_layers", None)
    return None if depth is None else int(depth)


def resolve_layers(config: Any) -> list[int] | None:
    """Λ the run will use: --layers, else the protocol's range clipped to the model's
    depth, else None (the engine default round(0.58 L) .. L-1)."""
    if config.layers is not None:
        return list(config.layers)
    from app.engine.runner import default_layers

    depth = model_depth(config.model)
    if depth is None:
        return None
    chosen = paper_layers(depth, spec(config.protocol).layers)
    return list(default_layers(depth)) if chosen is None else chosen


@contextmanager
def tile_budget(runner: Any, n: int, on: bool) -> Iterator[int | None]:
    """Cap a tiling image processor (InternVL's ``max_patches``) at min(12, 28 // N) tiles
    for one run, and restore it; yields the cap, or None when nothing was capped."""
    processor = getattr(getattr(runner, "processor", None), "image_processor", None)
    if not on or processor is None or not hasattr(processor, "max_patches"):
        yield None
        return
    saved = processor.max_patches, getattr(processor, "min_patches", None)
    processor.max_patches = tile_cap(n)
    if saved[1] is not None:
        processor.min_patches = min(saved[1], processor.max_patches)
    try:
        yield processor.max_patches
    finally:
        processor.max_patches = saved[0]
        if saved[1] is not None:
            processor.min_patches = saved[1]


def _name(image: Any, k: int) -> str:
    return image.name if isinstance(image, Path) else f"candidate {k}"


def _prompts(config: Any, n: int, runner: Any) -> dict[str, Any]:
    p = config.protocol_spec()
    labels = resolve_labels(config.labels, n)
    texts = {
        "vanilla": prompt_text(QUERY, labels, config.prompt_variant),
        "instruction": prompt_text(QUERY, labels, "instruction"),
        "cot": cot_prompt_text(QUERY, labels, p.cot.prompt),
        "self_consistency": cot_prompt_text(QUERY, labels, p.self_consistency.prompt),
    }
    out: dict[str, Any] = {"text": texts, "query_placeholder": QUERY}
    if hasattr(runner, "adapter"):  # the chat-template rendering the model reads
        out["rendered"] = {k: runner.adapter.render(n, v) for k, v in texts.items()}
    return out


def _forwards(config: Any, n: int, instances: int, calibration: int, k: int) -> dict[str, Any]:
    """Model forwards per instance of each method, and the run's total (generation: at most)."""
    p = config.protocol_spec()
    per: dict[str, Any] = {}
    for m in config.methods:
        if m in METHODS:
            per[m] = k if m == "perm_avg" else 1
        elif m == "instruction":
            per[m] = 1
        else:
            g = p.self_consistency if m == "self_consistency" else p.cot
            per[m] = f"<= {g.samples * g.max_new_tokens} (1 prompt + decode steps, x samples)"
    shared = 1 if any(m in METHODS for m in config.methods) else 0
    total = calibration * n + instances * shared
    total += instances * (k - 1) * ("perm_avg" in config.methods)
    total += instances * ("instruction" in config.methods)
    bound = total + sum(
        instances * g.samples * g.max_new_tokens
        for m, g in (("cot", p.cot), ("self_consistency", p.self_consistency))
        if m in config.methods
    )
    return {
        "per_instance": per,
        "shared": "vanilla, pride, attn_raw, attn_pure and agd read one forward per instance; "
        "perm_avg adds K - 1",
        "calibration": calibration * n,
        "needs_calibration": sorted(set(config.methods) & NEEDS_CALIBRATION),
        "total": total if bound == total else None,
        "total_at_most": bound,
    }


def protocol_entry(config: Any, runner: Any, plan: Any) -> dict[str, Any]:
    """One (n, setting) of protocol.json."""
    n = plan.n
    orderings = plan.orderings
    shared = bool((orderings == orderings[:1]).all())
    orders = (
        plan.options.perm_orders
        if plan.options.perm_orders is not None
        else [[(i + r) % n for i in range(n)] for r in range(n)]
    )
    instances = int(orderings.shape[0] * orderings.shape[1])
    return {
        "n": n,
        "setting": plan.setting,
        "calibration_setting": plan.calibration_setting,
        "calibration_dataset": plan.calibration_dataset,
        "items": [
            {
                "id": i.id,
                "query": i.query,
                "answer": i.answer,
                "candidates": [_name(im, k) for k, im in enumerate(i.images)],
            }
            for i in plan.items
        ],
        "calibration_items": [i.id for i in plan.calibration_items],
        "orderings": {
            "count": int(orderings.shape[1]),
            "shared_by_every_item": shared,
            "convention": "position p shows the item's candidate order[p]",
            "orders": orderings[0].tolist() if shared else orderings.tolist(),
        },
        "perm_avg_orders": [list(map(int, o)) for o in orders],
        "tile_cap": tile_cap(n) if config.protocol_spec().tile_cap else None,
        "prompts": _prompts(config, n, runner),
        "forward_passes": _forwards(config, n, instances, len(plan.calibration_items), len(orders)),
    }


def write_protocol(path: Path, config: Any, runner: Any, runs: Sequence[dict[str, Any]]) -> None:
    """protocol.json for the whole run (see the module docstring)."""
    p = config.protocol_spec()
    layers = list(runner.layers) if runner is not None else resolve_layers(config)
    doc = {
        "protocol": p.name,
        "command": config.command,
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dry_run": runner is None or config.dry_run,
        "model": config.model,
        "dataset": {
            "name": config.dataset,
            "data": _s(config.data),
            "images": _s(config.images),
            "instances": _s(config.instances),
            "clip": _s(config.clip),
            "calibration_dataset": config.calibration_dataset or config.dataset,
            "negatives": p.negatives,
        },
        "seeds": {
            "eval": config.eval_seed,
            "calibration": config.calibration_seed,
            "ordering": config.ordering_seed,
            "generation": config.generation_seed,
            "bootstrap": config.bootstrap_seed,
        },
        "image_preprocessing": {
            "resize": None if p.image_size is None else list(p.image_size),
            "resample": "bicubic" if p.image_size is not None else None,
            "tile_cap": "min(12, 28 // N) tiles (tiling processors: InternVL)"
            if p.tile_cap
            else "the processor's own",
            "then": "the model's own processor",
        },
        "methods": list(config.methods),
        "engine": {
            **asdict(config.method_config()),
            "labels": config.labels,
            "prompt_variant": config.prompt_variant,
            "layers": layers if layers is not None else "round(0.58 L) .. L-1",
        },
        "generation": {
            "cot": asdict(p.cot),
            "self_consistency": asdict(p.self_consistency),
            "inherited_from_checkpoint": False,
        },
        "calibration": {
            "items": config.calibration,
            "source": p.calibration,
            "design": "each item under its N cyclic rotations",
        },
        "notes": list(p.notes),
        "runs": list(runs),
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")


def _s(value: Any) -> str | None:
    return None if value is None else str(value)
