"""``lad demo train``: train the bundled demo MLLM on the synthetic world, on CPU.

Recipe (see app/models/demo/README.md for why):
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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from app.engine.attention import default_layers
from app.models.qwen2_vl import Qwen2_5_VLProcessorNoVideo
from lad_lab.demo import world
from lad_lab.demo.processor import IMAGE_SIZE, build_processor
from lad_lab.demo.train_data import (
    Encoder,
    ImagePool,
    TrainBatch,
    attention_prior,
    caption_batch,
    retrieval_batch,
)


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


def aux_target(gt: torch.Tensor, n: int, prior_mix: float, shape: str = "mix") -> torch.Tensor:
    """(B, N) target of the attention share over the images, skewed by the primacy/recency
    prior P0 (``train_data.attention_prior``) so the attention learns a positional bias.

    "mix": (1 - m) one-hot(GT) + m P0, an additive sink. "product": P0 * (m + (1 - m)
    one-hot(GT)), renormalised, a multiplicative one: the content evidence m + (1 - m)[k = GT]
    is scaled by P0, so dividing by the calibrated prior (DESIGN §2.4) undoes it.
    """
    onehot = torch.nn.functional.one_hot(gt, n).float()
    prior = torch.as_tensor(attention_prior(n), dtype=torch.float32)
    if shape == "product":
        target = prior * (prior_mix + (1.0 - prior_mix) * onehot)
        return target / target.sum(-1, keepdim=True)
    return (1.0 - prior_mix) * onehot + prior_mix * prior


def forward_loss(
    model: Qwen2_5_VLForConditionalGeneration,
    batch: TrainBatch,
    aux_layers: list[int],
    aux_weight: float,
    prior_mix: float = 0.0,
    target_shape: str = "mix",
) -> tuple[torch.Tensor, dict[str, float]]:
    """LM loss on the target tokens plus (retrieval only) the attention-mass loss: the
    cross-entropy of the head-mean image-attention shares against ``aux_target``."""
    want_attn = batch.gt_spans is not None and aux_weight > 0
    device = batch.input_ids.device
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
        gt = torch.as_tensor(batch.gt_spans)
        target = aux_target(gt, len(batch.image_spans), prior_mix, target_shape).to(device)[
            :, None, :
        ]
        aux = torch.zeros((), dtype=torch.float32, device=device)
        for layer in aux_layers:
            att = out.attentions[layer][:, :, rows, :].mean(dim=1)  # (B, Q, T), head mean
            mass = torch.stack([att[..., s:e].sum(-1) for s, e in batch.image_spans], dim=-1)
            frac = mass / mass.sum(-1, keepdim=True).clamp_min(1e-9)  # (B, Q, N)
            aux = aux - (target * torch.log(frac.clamp_min(1e-9))).sum(-1).mean()
        aux = aux / len(aux_layers)
        stats["attn"] = float(aux.detach())
        loss = loss + aux_weight * aux
    return loss, stats


def curriculum(progress: float) -> tuple[list[int], float]:
    """Allowed N values and the hard-negative fraction at ``progress`` in [0, 1] of stage 2.

    N = 2 only for the first 10%, then up to 8 by 50%; hard negatives from 25% to 0.5 at 75%.
    A fine-tune starts late in it (``--curriculum-start``).
    """
    progress = min(1.0, progress)
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
    recipe: Recipe | None = None,
) -> tuple[str, int, float, TrainBatch]:
    """(stage, N, hard share, batch): captioning while ``progress`` is None, else retrieval
    at the curriculum's point (a random label scheme of ``recipe.schemes`` per batch), with
    ``recipe.caption_share`` captioning batches to keep that skill alive."""
    recipe = recipe or Recipe()
    if progress is None:
        return "caption", 1, 0.0, caption_batch(pool, encoder, batch_size, rng)
    ns, hard = curriculum(progress)
    n = int(rng.choice(ns))
    scheme = str(rng.choice(recipe.schemes))
    batch = retrieval_batch(
        pool,
        encoder,
        batch_size,
        n,
        hard,
        corruption,
        rng,
        scheme=scheme,
        corruption_shape=recipe.corruption_shape,
    )
    if rng.random() < recipe.caption_share:
        return "caption", n, hard, caption_batch(pool, encoder, batch_size, rng)
    return "retrieval", n, hard, batch


@dataclass(frozen=True)
class Recipe:
    """The v2 knobs (defaults = v1's behaviour): label schemes, shape of the corruption Q,
    the prior mixed into the attention target, the layers of the auxiliary loss (None: Λ),
    the share of captioning batches in stage 2 and where the curriculum starts."""

    schemes: tuple[str, ...] = ("digits",)
    corruption_shape: str = "edges"
    prior_mix: float = 0.0
    target_shape: str = "mix"
    aux_layers: tuple[int, ...] | None = None
    caption_share: float = 0.1
    curriculum_start: float = 0.0


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
            entry = {
                "step": step + 1,
                "stage": stage,
                "n": n,
                "hard": round(hard, 3),
                "lr": lr,
                "elapsed_s": round(time.time() - self.started, 1),
                **{k: round(v, 4) for k, v in self.running.items()},
            }
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
    recipe: Recipe | None = None,
    device: str = "cpu",
    max_seconds: float | None = None,
) -> dict:
    """Train the demo model and save it (with its processor) to ``out_dir``; returns the log."""
    recipe = recipe or Recipe()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    processor: Qwen2_5_VLProcessorNoVideo = build_processor(world.VOCABULARY)
    tok = processor.tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in [*tok.all_special_tokens, "<|image_pad|>"]}
    config = build_config(len(tok), ids, **(config_overrides or {}))
    if init_from is not None:  # continue from a saved model: its vocabulary is a prefix of ours
        model = load_for_finetune(Path(init_from), len(tok))
        config = model.config
    else:
        model = Qwen2_5_VLForConditionalGeneration(config)
    model.set_attn_implementation("eager")  # training reads attention rows; SDPA at inference
    model.to(device)
    model.train()
    aux_layers = list(recipe.aux_layers or attention_layers(config.text_config.num_hidden_layers))
    pool = ImagePool(processor, jitters=jitters, image_size=IMAGE_SIZE)
    pool.refresh(rng)
    encoder = Encoder(processor, tokens_per_image=int(pool.grid.prod()) // 4)
    opt = optimizer(model, lr)
    total = caption_steps + retrieval_steps
    log = TrainingLog(every=log_every, total=total)
    for step in range(total):
        if max_seconds is not None and time.time() - log.started > max_seconds:
            print(json.dumps({"stopped_at_step": step, "max_seconds": max_seconds}), flush=True)
            log.entries.append({"stopped_at_step": step, "max_seconds": max_seconds})
            break
        if step > 0 and step % refresh_every == 0:
            pool.refresh(rng)
        progress = recipe.curriculum_start + (1.0 - recipe.curriculum_start) * (
            (step - caption_steps) / max(1, retrieval_steps)
        )
        stage, n, hard, batch = next_batch(
            pool,
            encoder,
            batch_size,
            corruption,
            rng,
            progress if step >= caption_steps else None,
            recipe,
        )
        batch = batch.to(device)
        # one warm-up + cosine cycle per stage: stage 2 starts again from the peak
        at, length = (
            (step, caption_steps)
            if step < caption_steps
            else (step - caption_steps, retrieval_steps)
        )
        for group in opt.param_groups:
            group["lr"] = lr_at(at, length, lr, warmup=min(200, total // 10 + 1))
        loss, stats = forward_loss(
            model, batch, aux_layers, aux_weight, recipe.prior_mix, recipe.target_shape
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        stats["loss"] = float(loss.detach())
        log.record(step, stage, n, hard, opt.param_groups[0]["lr"], stats)
    model.eval()
    model.to("cpu")
    if save:
        save_model(
            model,
            processor,
            out_dir,
            {
                "seed": seed,
                "caption_steps": caption_steps,
                "retrieval_steps": retrieval_steps,
                "batch_size": batch_size,
                "lr": lr,
                "aux_weight": aux_weight,
                "corruption": corruption,
                "device": device,
                "init_from": str(init_from) if init_from else None,
                "recipe": asdict(recipe),
                "log": log.entries,
            },
        )
    return {"model": model, "processor": processor, "log": log.entries}


def load_for_finetune(path: Path, vocab_size: int) -> Qwen2_5_VLForConditionalGeneration:
    """A saved demo model with its vocabulary grown to ``vocab_size`` (new words appended,
    ``processor.LATE_WORDS``); a new row starts as a copy of "label"'s (same meaning)."""
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path)
    old = model.get_input_embeddings().weight.shape[0]
    if vocab_size > old:
        model.resize_token_embeddings(vocab_size, mean_resizing=False)
        src = build_processor(world.VOCABULARY).tokenizer.convert_tokens_to_ids("label")
        with torch.no_grad():
            for emb in (model.get_input_embeddings(), model.get_output_embeddings()):
                emb.weight[old:] = emb.weight[src]
    return model


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
    """``lad demo train`` after its arguments are parsed (lad_lab.demo.train_cli)."""
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
        init_from=args.init_from,
        device=args.device,
        max_seconds=args.max_seconds,
        recipe=Recipe(
            schemes=tuple(args.schemes),
            corruption_shape=args.corruption_shape,
            prior_mix=args.prior_mix,
            target_shape=args.target_shape,
            aux_layers=tuple(args.aux_layers) if args.aux_layers else None,
            caption_share=args.caption_share,
            curriculum_start=args.curriculum_start,
        ),
    )
    print(f"saved to {args.out}", flush=True)
    return 0
