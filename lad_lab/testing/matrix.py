"""The model matrix: every model type of transformers' image-text-to-text mapping, served or not.

For each type, :func:`outcome` answers one of

- ``served``: ``build_tiny(type)`` built, and on it the image spans cover exactly the image
  tokens, the scores are a distribution, a batch mixing N = 3 and N = 5 equals its items
  alone, the captured attention equals eager attention to 1e-5 (float32), and the saved
  checkpoint served through ``load_runner`` (as ``LAD_MODEL=<dir>``) gives the same answers;
- ``refused``: the type's default config saved to a directory and handed to ``load_runner``
  is refused before any weight is read, with the reason (encoder-decoder, cross-attention
  images, no image tokens in the sequence), or the adapter refuses the type's processor
  (one that writes prompts of its own in place of the query);
- ``not built here``: no tiny instance could be built or checked here, with what broke (the
  service may still serve a real checkpoint of it through the generic adapter; untested).

``python -m lad_lab.testing.matrix [TYPE ...] --write`` runs the matrix and writes
``RESULTS`` (the committed record docs/models.md's matrix table is generated from, by
``python -m tools.docs matrix --write``); the slow test tests/integration/models/test_matrix.py
re-runs every type and holds it to that record.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).with_name("model_matrix.json")
SERVED, REFUSED, NOT_BUILT = "served", "refused", "not built here"
CHECKS = (
    "spans cover the image tokens",
    "scores normalised",
    "N=3+5 batch == alone",
    "captured == eager (1e-5, fp32)",
    "saved dir through load_runner",
)
TOLERANCE = 1e-5


def image_text_types() -> tuple[str, ...]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return tuple(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def mixed_items(seed: int = 0) -> list[Any]:
    """N = 3 and N = 5, images of different sizes and aspect ratios (large enough that
    processors cutting an image into tiles of its aspect give every image tokens)."""
    from app.engine.runner import RetrievalItem
    from lad_lab.testing.tiny_models import random_images

    return [
        RetrievalItem("a red square", random_images(3, seed=seed, sizes=[(96, 96), (80, 112)])),
        RetrievalItem(
            "two dogs on a blue sofa",
            random_images(5, seed=seed + 1, sizes=[(128, 80), (64, 64), (112, 56)]),
        ),
    ]


def refused_reason(model_type: str) -> str | None:
    """The load path's refusal of the type's default config (None: not refused)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from app.models.loader import ModelLoadError, load_runner

    with tempfile.TemporaryDirectory() as directory:
        CONFIG_MAPPING[model_type]().save_pretrained(directory)
        try:
            load_runner(directory, device="cpu")
        except ModelLoadError as exc:
            if "cannot serve" in str(exc):
                return str(exc).split(": ", 1)[1].split(" (adapters written for")[0]
        except Exception:  # a config that is served but has no weights: not refused
            return None
    return None


def image_token_count(runner: Any, ids: Any) -> tuple[int, int]:
    """(image tokens inside the spans, image tokens in the row) for the config's image id."""
    from app.models.conventions import image_token_id

    image_id = image_token_id(runner.model.config)
    return image_id, int((ids == image_id).sum())


def served_checks(runner: Any, directory: Path) -> dict[str, str]:
    """Each check of a served type: "ok" or what went wrong."""
    from app.engine.attention import eager_attentions, span_mass
    from app.models.loader import load_runner

    results: dict[str, str] = {}
    items = mixed_items(seed=3)
    batch = runner.process(items)
    problems = []
    for row, item in enumerate(items):
        ids = batch.input_ids[row]
        spans = runner.adapter.image_spans(ids, len(item.images))
        image_id, total = image_token_count(runner, ids)
        covered = sum(int((ids[s:e] == image_id).sum()) for s, e in spans)
        ordered = all(e <= s2 for (_, e), (s2, _) in itertools.pairwise(spans))
        if not (total > 0 and covered == total and ordered and len(spans) == len(item.images)):
            problems.append(f"row {row}: {covered} of {total} image tokens in {len(spans)} spans")
    results[CHECKS[0]] = "; ".join(problems) or "ok"
    out = runner.forward(items)
    sums = [float(np.exp(s).sum()) for s in out.scores]
    results[CHECKS[1]] = "ok" if all(abs(x - 1) < 1e-6 for x in sums) else f"sums {sums}"
    worst = 0.0
    alones = []
    for item, scores, attention in zip(items, out.scores, out.attention, strict=True):
        alone = runner.forward([item])
        alones.append(alone)
        worst = max(
            worst,
            float(np.max(np.abs(scores - alone.scores[0]))),
            float(np.max(np.abs(attention - alone.attention[0]))),
        )
    results[CHECKS[2]] = "ok" if worst <= TOLERANCE else f"max diff {worst:.1e}"
    one = items[:1]
    captured = alones[0].attention[0]  # the capture of the first item alone (check 3's)
    single = runner.process(one)
    spans = runner.adapter.image_spans(single.input_ids[0], len(one[0].images))
    attentions = eager_attentions(runner.model, runner.adapter, single, logits_to_keep=1)
    eager = span_mass(attentions, 0, -1, runner.layers, spans)
    diff = float(np.max(np.abs(captured - eager)))
    results[CHECKS[3]] = "ok" if diff <= TOLERANCE else f"max diff {diff:.1e}"
    runner.model.save_pretrained(directory)
    runner.processor.save_pretrained(directory)
    loaded = load_runner(str(directory), device="cpu")
    again = loaded.forward(items)
    same = type(loaded.adapter) is type(runner.adapter) and all(
        np.allclose(x, y, atol=1e-6, rtol=0)
        for x, y in zip(out.scores + out.attention, again.scores + again.attention, strict=True)
    )
    results[CHECKS[4]] = "ok" if same else "the loaded checkpoint answers differently"
    return results


def outcome(model_type: str, runner: Any = None) -> dict[str, Any]:
    """This type's row of the matrix (module docstring). ``runner``: one already made over
    ``build_tiny(model_type)`` (``tiny_runner(model_type)``, e.g. another test's), checked
    instead of a new build; the checks leave it as they found it."""
    from app.models.loader import make_runner
    from lad_lab.testing.tiny_models import build_tiny

    started = time.perf_counter()
    row: dict[str, Any] = {"model_type": model_type}
    reason = refused_reason(model_type)
    if reason is not None:
        return {**row, "status": REFUSED, "reason": reason}
    try:
        if runner is None:
            model, processor = build_tiny(model_type)
            try:
                runner = make_runner(model, processor, model_id=f"tiny-{model_type}")
            except ValueError as exc:  # refused once its processor is there (processor_probe)
                if not str(exc).startswith("cannot serve"):
                    raise
                return {**row, "status": REFUSED, "reason": str(exc)}
        with tempfile.TemporaryDirectory() as directory:
            checks = served_checks(runner, Path(directory))
    except Exception as exc:  # anything that stops the tiny build or its checks: recorded
        what = str(exc).splitlines()[0] if str(exc) else ""
        return {**row, "status": NOT_BUILT, "reason": f"{type(exc).__name__}: {what}"[:240]}
    failed = {k: v for k, v in checks.items() if v != "ok"}
    adapter = type(runner.adapter).__name__
    if failed:
        why = "; ".join(f"{k}: {v}" for k, v in failed.items())
        return {**row, "status": NOT_BUILT, "reason": f"checks failed: {why}", "adapter": adapter}
    return {
        **row,
        "status": SERVED,
        "adapter": adapter,
        "tested": list(checks),
        "seconds": round(time.perf_counter() - started, 1),
    }


def counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {
        status: sum(r["status"] == status for r in rows) for status in (SERVED, REFUSED, NOT_BUILT)
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lad_lab.testing.matrix", description=__doc__)
    parser.add_argument("types", nargs="*", help="model types (default: the whole mapping)")
    parser.add_argument("--write", action="store_true", help=f"update {RESULTS.name}")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    rows = []
    for model_type in args.types or image_text_types():
        row = outcome(model_type)
        rows.append(row)
        print(f"{row['status']:15s} {model_type:28s} {row.get('reason', '')[:150]}", flush=True)
    print(json.dumps(counts(rows)))
    if args.write:
        known = (
            {r["model_type"]: r for r in json.loads(RESULTS.read_text())["types"]}
            if (RESULTS.exists())
            else {}
        )
        known.update({r["model_type"]: r for r in rows})
        ordered = [known[t] for t in image_text_types() if t in known]
        import transformers

        record = {
            "command": "python -m lad_lab.testing.matrix --write",
            "transformers": transformers.__version__,
            "counts": counts(ordered),
            "types": ordered,
        }
        RESULTS.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
