"""Tiny dataset fixtures written in code: world images as PNG files, a COCO captions +
instances pair, a jsonl file, and a tiny random CLIP saved to a folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lad_lab.demo import world


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
    captions = {
        "images": [{"id": i + 1, "file_name": name} for i, (name, _) in enumerate(images)],
        "annotations": [
            {"id": 100 + i, "image_id": i + 1, "caption": text}
            for i, (_, text) in enumerate(images)
        ],
    }
    captions["annotations"].append({"id": 999, "image_id": 1, "caption": "another caption"})
    instances = {
        "annotations": [{"image_id": i + 1, "category_id": 1 + i % 3} for i in range(count)]
    }
    (root / "captions.json").write_text(json.dumps(captions))
    (root / "instances.json").write_text(json.dumps(instances))
    return root / "captions.json", root / "images", root / "instances.json"


def write_jsonl(root: Path, count: int = 10, n_images: int = 4) -> Path:
    images = write_world_images(root / "imgs", count * n_images)
    lines = []
    for i in range(count):
        names = [f"imgs/{images[i * n_images + k][0]}" for k in range(n_images)]
        answer = i % n_images
        lines.append(
            {
                "query": images[i * n_images + answer][1],
                "images": names,
                "answer": answer,
                "id": f"q{i}",
            }
        )
    lines.append({"query": "too few", "images": names[:2], "answer": 0})
    path = root / "items.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def tiny_clip(folder: Path) -> Path:
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(0)
    config = CLIPConfig(
        text_config={
            "vocab_size": 99,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 16,
            "bos_token_id": 0,
            "pad_token_id": 0,
            "eos_token_id": 2,
        },  # 2: pool at the largest token id (CLIP's legacy rule)
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        projection_dim=8,
    )
    CLIPModel(config).save_pretrained(folder)
    _word_tokenizer(98).save_pretrained(folder)  # for the paper rule's caption cosine
    CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    ).save_pretrained(folder)
    return folder


def _word_tokenizer(size: int):
    """A word-level tokenizer over the world's caption words (ids < ``size``), built in code."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted(
        {
            w
            for i in range(200)
            for w in world.caption(world.sample_object(np.random.default_rng(i))).split()
        }
    )
    vocab = {"<pad>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(words[: size - 2])}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>")
