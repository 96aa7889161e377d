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

from app.engine.labels import cot_prompt_text, prompt_text, resolve_labels
from app.method.methods import METHODS, NEEDS_CALIBRATION
from lad_lab.eval.paper import paper_layers, spec, tile_cap

QUERY = "{query}"
"""Stands for the caption in the prompts written to protocol.json."""


def model_file(model: str, name: str) -> dict[str, Any] | None:
    """A JSON file of a local or cached checkpoint (config.json, generation_config.json),
    read as JSON: no weights, no class lookup, so no remote-code prompt; None if absent."""
    from app.models.loader import DEMO_MODEL_DIR

    where = Path(DEMO_MODEL_DIR) if model == "demo" else Path(model)
    path: Any = where / name if where.is_dir() else None
    if path is None:
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(model, name)
        except (ImportError, ValueError):
            return None
    if not isinstance(path, str | Path) or not Path(path).is_file():
        return None
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


DEPTH_KEYS = ("num_hidden_layers", "num_layers", "n_layer")
NESTED_CONFIGS = ("text_config", "llm_config", "language_config", "text_model_config")


def model_depth(model: str) -> int | None:
    """L of a local or cached model from its config.json alone; None if unknown."""
    config = model_file(model, "config.json")
    if config is None:
        return None
    for where in [*(config.get(k) for k in NESTED_CONFIGS), config]:
        if isinstance(where, dict):
            for key in DEPTH_KEYS:
                if isinstance(where.get(key), int) and where[key] > 0:
                    return int(where[key])
    return None


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


def _generated(config: Any) -> dict[str, Any]:
    """method -> its GenerationSpec, for every method of the run that generates text."""
    p = config.protocol_spec()
    specs = {"cot": p.cot, "self_consistency": p.self_consistency}
    if p.answers is not None:
        specs |= {"vanilla": p.answers, "instruction": p.answers}
    return {m: g for m, g in specs.items() if m in config.methods}


def _forwards(config: Any, n: int, instances: int, calibration: int, k: int) -> dict[str, Any]:
    """The cost of one run: prompt forwards (a sampled sequence's prefill counts once) and
    decode steps (at most: every sequence runs to its token budget), per instance and total."""
    generated = _generated(config)
    per: dict[str, Any] = {}
    prompts = decode = 0
    for m in config.methods:
        if m in generated:
            g = generated[m]
            per[m] = f"{g.samples} prompt + <= {g.samples * (g.max_new_tokens - 1)} decode steps"
            prompts += g.samples
            decode += g.samples * (g.max_new_tokens - 1)
        else:
            per[m] = k if m == "perm_avg" else 1
    shared = any(m in METHODS and m not in generated for m in config.methods)
    prompts += int(shared) + (k - 1) * ("perm_avg" in config.methods)
    prompts += int("instruction" in config.methods and "instruction" not in generated)
    total_prompts = calibration * n + instances * prompts
    return {
        "per_instance": per,
        "shared": "pride, attn_raw, attn_pure and agd (and vanilla when scored) read one "
        "forward per instance; perm_avg adds K - 1",
        "calibration": calibration * n,
        "needs_calibration": sorted(set(config.methods) & NEEDS_CALIBRATION),
        "prompt_forwards": total_prompts,
        "decode_steps_at_most": instances * decode,
        "total": total_prompts if decode == 0 else None,
        "total_at_most": total_prompts + instances * decode,
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
            "benchmark": config.benchmark_name(),
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
            else "InternVL: min(max_patches, 28 // N) tiles (the adapter's cap); "
            "others: the processor's own",
            "then": "the model's own processor",
        },
        "methods": list(config.methods),
        "engine": {
            **asdict(config.method_config()),
            "labels": config.labels,
            "prompt_variant": config.prompt_variant,
            "layers": layers if layers is not None else "round(0.58 L) .. L-1",
        },
        "answers": _answers(p),
        "generation": {
            "cot": asdict(p.cot),
            "self_consistency": asdict(p.self_consistency),
            **({} if p.answers is None else {"vanilla_and_instruction": asdict(p.answers)}),
            "inherited_from_checkpoint": p.cot.inherit,
            "checkpoint_generation_config": model_file(config.model, "generation_config.json")
            if p.cot.inherit
            else None,
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


def _answers(p: Any) -> dict[str, str]:
    """How vanilla and instruction choose (the score methods always read label scores)."""
    if p.answers is None:
        how = "argmax of the restricted label log-probabilities of one forward (§2.1)"
    else:
        how = (
            f"generated: {p.answers.max_new_tokens} greedy tokens, the last number in "
            "1..N of the text (the authors' regex); a parse failure counts as wrong"
        )
    return {"vanilla": how, "instruction": how}


def _s(value: Any) -> str | None:
    return None if value is None else str(value)
