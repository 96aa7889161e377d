"""A vector index as the first stage, the service as the debiased reranker.

The synthetic world's images are indexed in faiss (exact inner-product search over unit
vectors) by the demo model's *pooled vision-tower features*; a caption's 16 nearest images
are then reranked through ``POST /v1/rerank`` with ``LadClient.rerank``.

The demo world has no text tower (no CLIP): the query vector is the same vision tower's
feature of the caption's scene rendered without jitter (query by example). That is the one
stand-in here; with a real model put a text encoder in ``query_vector``.

    pip install -e ".[examples]"          # faiss-cpu
    lad serve &                           # the demo model, default profile store
    python examples/vector_search_rerank.py --calibrate --queries 20

``--calibrate`` first calibrates every N up to 8 from 5 examples of 8 candidates
(``n: "all"``), which the agd tournament needs for its windows.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import faiss
import numpy as np
import torch
from PIL import Image

from app.models.loader import load_runner
from lad_client import LadClient
from lad_lab.demo.world import caption, make_items, render, sample_object


@torch.no_grad()
def vision_features(runner, images: list[Image.Image]) -> np.ndarray:
    """Mean-pooled vision-tower output of each image, L2-normalised (rows)."""
    processed = runner.processor.image_processor(images=images, return_tensors="pt")
    grid = processed["image_grid_thw"]
    visual = runner.model.model.visual
    tokens = visual(processed["pixel_values"].to(runner.dtype), grid_thw=grid)
    tokens = getattr(tokens, "pooler_output", tokens)  # transformers 5 returns an output object
    merge = visual.spatial_merge_size**2
    counts = (grid.prod(dim=-1) // merge).tolist()
    pooled = torch.stack([t.mean(dim=0) for t in torch.split(tokens, counts)]).float().numpy()
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def build_index(runner, images: list[Image.Image], batch: int = 64) -> faiss.IndexFlatIP:
    vectors = np.concatenate(
        [vision_features(runner, images[i : i + batch]) for i in range(0, len(images), batch)]
    )
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors.astype(np.float32))
    return index


def query_vector(runner, obj) -> np.ndarray:
    """The caption's scene rendered without jitter, through the same tower."""
    return vision_features(runner, [render(replace(obj, jitter=(0.0,) * 5))]).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", default=None, help="retrieve / admin bearer token")
    parser.add_argument("--gallery", type=int, default=400, help="images in the index")
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--top-k", type=int, default=16, help="first-stage candidates")
    parser.add_argument("--method", default="agd")
    parser.add_argument("--calibrate", action="store_true", help='calibrate n: "all" first')
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    runner = load_runner("demo", device="cpu", dtype="float32")
    rng = np.random.default_rng(args.seed)
    objects = [sample_object(rng) for _ in range(args.gallery)]
    images = [render(obj) for obj in objects]
    index = build_index(runner, images)
    print(f"indexed {index.ntotal} images, {index.d}-d pooled vision features (faiss)")

    lad = LadClient(args.url, token=args.token, admin_token=args.token, timeout=120)
    if args.calibrate:
        examples = make_items(5, n_candidates=8, seed="calibration")
        done = lad.calibrate([(e.query, e.images, e.target) for e in examples], n="all")
        print(f"calibrated N = {[e.n for e in done.per_n or []]}: {done.forward_passes} passes")

    first_hits = rerank_hits = recalled = passes = 0
    for q in rng.choice(args.gallery, size=args.queries, replace=False):
        text = caption(objects[q])
        relevant = {i for i, o in enumerate(objects) if caption(o) == text}
        _, found = index.search(query_vector(runner, objects[q]), args.top_k)
        candidates = [int(i) for i in found[0]]
        ranked = lad.rerank(text, [images[i] for i in candidates], top_n=1, method=args.method)
        best = candidates[ranked.results[0].index]
        first_hits += candidates[0] in relevant
        rerank_hits += best in relevant
        recalled += bool(relevant & set(candidates))
        passes += ranked.meta.forward_passes
        print(
            f"{text!r}: index top-1 {'ok' if candidates[0] in relevant else '--'}, "
            f"reranked top-1 {'ok' if best in relevant else '--'} "
            f"({ranked.meta.forward_passes} passes, windows {ranked.meta.windows})"
        )
    n = args.queries
    print(
        f"\n{n} queries: recall@{args.top_k} {100 * recalled / n:.0f} %, index top-1 "
        f"{100 * first_hits / n:.0f} %, reranked ({args.method}) top-1 "
        f"{100 * rerank_hits / n:.0f} %, {passes / n:.1f} forward passes per query"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
