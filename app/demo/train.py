"""``lad demo train``: train the bundled demo MLLM on the synthetic world, on CPU.

Recipe (see app/demo/model/README.md for why):
1. stage "caption": single image -> its caption (LM loss), so the vision tower and the
   text model learn the attributes before any retrieval;
2. stage "retrieval": N candidates + caption query in the paper's prompt (DESIGN §2.6)
   -> the index of the matching image; a curriculum grows N from 2 to 8 and brings in
   hard negatives (one attribute away) gradually;
3. the training answer is drawn from a position-conditional corruption Q(answer | GT
   position) (``answer_distribution``): the answer head inherits a conditional position
   bias, as real MLLMs inherit one from their data;
4. an auxiliary loss on the attention mass of the caption tokens and of the last prompt
   token over the image spans, in the layers Λ, ties the attention to the true GT image
   (the model card says so).

Everything is deterministic given ``--seed`` and ``--threads``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from app.demo import world
from app.demo.processor import IMAGE_SIZE, build_processor
from app.demo.train_data import (
    Encoder,
    ImagePool,
    TrainBatch,
    caption_batch,
    retrieval_batch,
)
from app.engine.attention import default_layers
from app.models.qwen2_vl import Qwen2_5_VLProcessorNoVideo


def build_config(vocab_size: int, tokenizer_ids: dict[str, int], **overrides) -> Qwen2_5_VLConfig:
    """The demo architecture: a real Qwen2.5-VL config, shrunk (4 tokens per 56 px image)."""
    text = {
        "vocab_size": vocab_size,
        "hidden_size": 192,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 6, 6]},
        "bos_token_id": tokenizer_ids["<|endoftext|>"],
        "eos_token_id": tokenizer_ids["<|im_end|>"],
        "pad_token_id": tokenizer_ids["<|endoftext|>"],
        "tie_word_embeddings": False,
    }
    vision = {
        "depth": 3,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_heads": 4,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [2],
        "out_hidden_size": 192,
    }
    text.update(overrides.pop("text", {}))
    vision.update(overrides.pop("vision", {}))
    vision["out_hidden_size"] = text["hidden_size"]
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=tokenizer_ids["<|image_pad|>"],
        video_token_id=tokenizer_ids["<|video_pad|>"],
        vision_start_token_id=tokenizer_ids["<|vision_start|>"],
        vision_end_token_id=tokenizer_ids["<|vision_end|>"],
        tie_word_embeddings=False,
        **overrides,
    )


def attention_layers(num_layers: int) -> list[int]:
    """Λ of DESIGN §2.2, the layers the auxiliary attention loss covers."""
    return list(default_layers(num_layers))


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up then cosine decay to 5% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def forward_loss(
    model: Qwen2_5_VLForConditionalGeneration,
    batch: TrainBatch,
    aux_layers: list[int],
    aux_weight: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """LM loss on the target tokens plus (retrieval only) the attention-mass loss."""
    want_attn = batch.gt_spans is not None and aux_weight > 0
    out = model(
        input_ids=batch.input_ids,
        pixel_values=batch.pixel_values,
        image_grid_thw=batch.image_grid_thw,
        mm_token_type_ids=batch.mm_token_type_ids,
        output_attentions=want_attn,
        use_cache=False,
    )
    logits = out.logits[:, :-1].float()
    targets = batch.labels[:, 1:]
    lm = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
    )
    stats = {"lm": float(lm.detach())}
    loss = lm
    if want_attn:
        # rows of the caption words and of t_q: all of them should look at the GT image
        rows = slice(batch.caption_start, batch.query_position + 1)
        gt = torch.as_tensor(batch.gt_spans)[:, None, None]
        aux = torch.zeros((), dtype=torch.float32)
        for layer in aux_layers:
            att = out.attentions[layer][:, :, rows, :].mean(dim=1)  # (B, Q, T), head mean
            mass = torch.stack([att[..., s:e].sum(-1) for s, e in batch.image_spans], dim=-1)
            frac = mass / mass.sum(-1, keepdim=True).clamp_min(1e-9)  # (B, Q, N)
            gt_frac = frac.gather(-1, gt.expand(-1, frac.shape[1], 1)).clamp_min(1e-9)
            aux = aux - torch.log(gt_frac).mean()
        aux = aux / len(aux_layers)
        stats["attn"] = float(aux.detach())
        loss = loss + aux_weight * aux
    return loss, stats


def curriculum(progress: float) -> tuple[list[int], float]:
    """Allowed N values and the hard-negative fraction at ``progress`` in [0, 1] of stage 2.

    N = 2 only for the first 10%, then up to 8 by 50%; hard negatives from 25% to 0.5 at 75%.
    """
    max_n = min(8, 2 + max(0, int((progress - 0.1) * 16)))
    hard = min(0.5, max(0.0, (progress - 0.25) * 1.0))
    return list(range(2, max_n + 1)), hard


def optimizer(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW (β = 0.9, 0.98), weight decay 0.01 on matrices only (not norms or biases)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
    )


def next_batch(
    pool: ImagePool,
    encoder: Encoder,
    batch_size: int,
    corruption: float,
    rng: np.random.Generator,
    progress: float | None,
) -> tuple[str, int, float, TrainBatch]:
    """(stage, N, hard share, batch): captioning while ``progress`` is None, else retrieval
    at the curriculum's point, with 10 % captioning batches to keep that skill alive."""
    if progress is None:
        return "caption", 1, 0.0, caption_batch(pool, encoder, batch_size, rng)
    ns, hard = curriculum(progress)
    n = int(rng.choice(ns))
    batch = retrieval_batch(pool, encoder, batch_size, n, hard, corruption, rng)
    if rng.random() < 0.1:
        return "caption", n, hard, caption_batch(pool, encoder, batch_size, rng)
    return "retrieval", n, hard, batch


class TrainingLog:
    """Running means (0.9 decay) of the losses per stage tag, printed and kept every K steps."""

    def __init__(self, every: int, total: int) -> None:
        self.every, self.total = every, total
        self.entries: list[dict] = []
        self.running: dict[str, float] = {}
        self.started = time.time()

    def record(
        self, step: int, stage: str, n: int, hard: float, lr: float, stats: dict[str, float]
    ) -> None:
        tag = "caption" if stage == "caption" else f"n{n}"
        for k, v in stats.items():
            self.running[f"{tag}.{k}"] = 0.9 * self.running.get(f"{tag}.{k}", v) + 0.1 * v
        if (step + 1) % self.every == 0 or step == self.total - 1:
            entry = {"step": step + 1, "stage": stage, "n": n, "hard": round(hard, 3), "lr": lr,
                     "elapsed_s": round(time.time() - self.started, 1),
                     **{k: round(v, 4) for k, v in self.running.items()}}  # fmt: skip
            self.entries.append(entry)
            print(json.dumps(entry), flush=True)


def train(
    out_dir: Path,
    *,
    caption_steps: int = 1200,
    retrieval_steps: int = 6800,
    batch_size: int = 16,
    lr: float = 2e-3,
    seed: int = 0,
    aux_weight: float = 1.0,
    corruption: float = 1.0,
    log_every: int = 50,
    jitters: int = 3,
    refresh_every: int = 400,
    config_overrides: dict | None = None,
    init_from: Path | None = None,
    save: bool = True,
) -> dict:
    """Train the demo model and save it (with its processor) to ``out_dir``; returns the log."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    processor: Qwen2_5_VLProcessorNoVideo = build_processor(world.VOCABULARY)
    tok = processor.tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in [*tok.all_special_tokens, "<|image_pad|>"]}
    config = build_config(len(tok), ids, **(config_overrides or {}))
    if init_from is not None:  # continue from a saved model (same tokenizer)
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(init_from)
    else:
        model = Qwen2_5_VLForConditionalGeneration(config)
    model.set_attn_implementation("eager")  # training reads attention rows; SDPA at inference
    model.train()
    aux_layers = attention_layers(config.text_config.num_hidden_layers)
    pool = ImagePool(processor, jitters=jitters, image_size=IMAGE_SIZE)
    pool.refresh(rng)
    encoder = Encoder(processor, tokens_per_image=int(pool.grid.prod()) // 4)
    opt = optimizer(model, lr)
    total = caption_steps + retrieval_steps
    log = TrainingLog(every=log_every, total=total)
    for step in range(total):
        if step > 0 and step % refresh_every == 0:
            pool.refresh(rng)
        progress = (step - caption_steps) / max(1, retrieval_steps)
        stage, n, hard, batch = next_batch(
            pool, encoder, batch_size, corruption, rng, progress if step >= caption_steps else None
        )
        # one warm-up + cosine cycle per stage: stage 2 starts again from the peak
        at, length = (step, caption_steps) if step < caption_steps else (
            step - caption_steps, retrieval_steps)
        for group in opt.param_groups:
            group["lr"] = lr_at(at, length, lr, warmup=min(200, total // 10 + 1))
        loss, stats = forward_loss(model, batch, aux_layers, aux_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        stats["loss"] = float(loss.detach())
        log.record(step, stage, n, hard, opt.param_groups[0]["lr"], stats)
    model.eval()
    if save:
        save_model(model, processor, out_dir, {"seed": seed, "caption_steps": caption_steps,
                   "retrieval_steps": retrieval_steps, "batch_size": batch_size, "lr": lr,
                   "aux_weight": aux_weight, "corruption": corruption,
                   "log": log.entries})  # fmt: skip
    return {"model": model, "processor": processor, "log": log.entries}


def save_model(
    model: Qwen2_5_VLForConditionalGeneration,
    processor: Qwen2_5_VLProcessorNoVideo,
    out_dir: Path,
    record: dict,
) -> None:
    """save_pretrained for model and processor (SDPA at inference) + the training record."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.config._attn_implementation = "sdpa"
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    (out_dir / "training_log.json").write_text(json.dumps(record, indent=1) + "\n")


def run(args: argparse.Namespace) -> int:
    """``lad demo train`` after its arguments are parsed (app.demo.train_cli)."""
    torch.set_num_threads(args.threads)
    caption_steps = round(args.steps * args.caption_fraction)
    train(
        args.out,
        caption_steps=caption_steps,
        retrieval_steps=args.steps - caption_steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        aux_weight=args.aux_weight,
        corruption=args.corruption,
        log_every=args.log_every,
    )
    print(f"saved to {args.out}", flush=True)
    return 0

