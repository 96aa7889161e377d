"""Tiny dataset fixtures written in code: world images as PNG files, a COCO captions +
instances pair, a jsonl file, and a tiny random CLIP saved to a folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.demo import world


def write_world_images(folder: Path, count: int, seed: int = 0) -> list[tuple[str, str]]:
    """(file name, caption) of ``count`` world images saved as PNG."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        obj = world.sample_object(rng)
        name = f"im{i:03d}.png"
        world.render(obj, 56).save(folder / name)
        out.append((name, world.caption(obj)))
    return out


def write_coco(root: Path, count: int = 12) -> tuple[Path, Path, Path]:
    images = write_world_images(root / "images", count)
    captions = {"images": [{"id": i + 1, "file_name": name} for i, (name, _) in enumerate(images)],
                "annotations": [{"id": 100 + i, "image_id": i + 1, "caption": text}
                                for i, (_, text) in enumerate(images)]}  # fmt: skip
    captions["annotations"].append({"id": 999, "image_id": 1, "caption": "another caption"})
    instances = {"annotations": [{"image_id": i + 1, "category_id": 1 + i % 3}
                                 for i in range(count)]}  # fmt: skip
    (root / "captions.json").write_text(json.dumps(captions))
    (root / "instances.json").write_text(json.dumps(instances))
    return root / "captions.json", root / "images", root / "instances.json"


def write_jsonl(root: Path, count: int = 10, n_images: int = 4) -> Path:
    images = write_world_images(root / "imgs", count * n_images)
    lines = []
    for i in range(count):
        names = [f"imgs/{images[i * n_images + k][0]}" for k in range(n_images)]
        answer = i % n_images
        lines.append({"query": images[i * n_images + answer][1], "images": names,
                      "answer": answer, "id": f"q{i}"})  # fmt: skip
    lines.append({"query": "too few", "images": names[:2], "answer": 0})
    path = root / "items.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def tiny_clip(folder: Path) -> Path:
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(0)
    config = CLIPConfig(
        text_config={"vocab_size": 99, "hidden_size": 16, "intermediate_size": 32,
                     "num_hidden_layers": 1, "num_attention_heads": 2,
                     "max_position_embeddings": 16},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
        projection_dim=8,
    )  # fmt: skip
    CLIPModel(config).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32},
                       crop_size={"height": 32, "width": 32}).save_pretrained(folder)  # fmt: skip
    return folder


