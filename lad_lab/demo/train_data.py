"""Training data of the demo model: an image pool, prompt ids, batches, label corruption.

Images are rendered by the synthetic world and pre-processed by the real image processor
once per pool refresh; prompt ids are built from the same chat template and prompt text
as at inference (``app.models.prompts``), so training sequences are exactly what the
processor produces for a retrieval request (a test checks it).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from app.engine.labels import SCHEMES, prompt_text, resolve_labels
from app.models.qwen2_vl import Qwen2_5_VLProcessorNoVideo
from lad_lab.demo import world

DIGITS: tuple[str, ...] = tuple(str(i) for i in range(1, 13))
CAPTION_PROMPT = "Describe the image."


def answer_distribution(n: int, strength: float = 1.0) -> np.ndarray:
    """Q(answer = j | GT at t), an (n, n) row-stochastic matrix: the training-label corruption.

    The GT keeps probability 1 - rho_t, where rho_t = strength * r(t / (n-1)) is small at the
    first position (0.15), larger at the last (0.35) and largest in the middle (up to 0.7):
    the lost mass goes mostly to the first position (60%), then the last (30%), the rest
    spread over the other positions, so the resulting bias depends on the GT position.
    """
    q = np.zeros((n, n))
    for t in range(n):
        u = t / (n - 1) if n > 1 else 0.0
        rho = min(0.95, strength * (0.15 + 0.45 * math.sin(math.pi * u) + 0.2 * u)) if n > 1 else 0
        w = np.full(n, 0.1 / max(1, n - 3))
        w[0], w[n - 1] = 0.6, 0.3
        w[t] = 0.0
        q[t] = rho * w / w.sum() if n > 1 else 0.0
        q[t, t] = 1.0 - rho
    return q


def neighbour_distribution(n: int, strength: float = 1.0) -> np.ndarray:
    """Q(answer = j | GT at t) of the v2 recipe: milder, and toward neighbours and edges.

    The GT keeps 1 - rho_t, rho_t = strength * (0.12 + 0.33 sin(pi u) + 0.1 u), u = t/(n-1):
    about 0.12 at the first position, 0.22 at the last, up to 0.45 in the middle, so the GT
    stays the mode of every row (the content signal survives at every position). The lost
    mass goes half to the adjacent positions and half to the two ends (first 0.6, last 0.4):
    a conditional bias, like an MLLM that confuses a middle image with its neighbours and
    drifts to the first or the last image when unsure.
    """
    q = np.zeros((n, n))
    if n == 1:
        q[0, 0] = 1.0
        return q
    for t in range(n):
        u = t / (n - 1)
        rho = min(0.9, strength * (0.12 + 0.33 * math.sin(math.pi * u) + 0.1 * u))
        near = np.zeros(n)
        for j in (t - 1, t + 1):
            if 0 <= j < n:
                near[j] = 1.0
        ends = np.zeros(n)
        ends[0], ends[n - 1] = 0.6, 0.4
        ends[t] = 0.0
        w = 0.5 * near / near.sum() + (0.5 * ends / ends.sum() if ends.sum() > 0 else 0.0)
        q[t] = rho * w / w.sum()
        q[t, t] = 1.0 - rho
    return q


CORRUPTIONS = {"edges": answer_distribution, "neighbours": neighbour_distribution}


def attention_prior(n: int, primacy: float = 0.5, recency: float = 0.3) -> np.ndarray:
    """A primacy/recency attention prior over N images (sums to 1): the first image gets
    ``primacy``, the last ``recency`` (of what is left), the middle ones share the rest, like
    the attention sinks of real MLLMs. Mixed into the auxiliary attention target."""
    if n == 1:
        return np.ones(1)
    p = np.full(n, (1.0 - primacy - recency) / max(1, n - 2))
    p[0], p[n - 1] = primacy, recency if n > 2 else 1.0 - primacy
    return p / p.sum()


@dataclass
class TrainBatch:
    """One batch of equal-length sequences (no padding: every caption has 11 words)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    mm_token_type_ids: torch.Tensor
    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    query_position: int = -1  # t_q, the last prompt position
    caption_start: int = -1  # first token of the caption words in the prompt
    image_spans: list[tuple[int, int]] | None = None  # R_k incl. vision start/end
    gt_spans: list[int] | None = None  # true GT position per row (not the corrupted answer)

    def to(self, device: str | torch.device) -> TrainBatch:
        """The same batch with its tensors on ``device``."""
        if str(device) == "cpu":
            return self
        names = ("input_ids", "labels", "mm_token_type_ids", "pixel_values", "image_grid_thw")
        moved = {k: getattr(self, k).to(device) for k in names}
        return replace(self, **moved)


class ImagePool:
    """Every attribute combination x a few jitters, rendered and pre-processed once.

    ``refresh`` redraws the jitters so that the model never sees the same pixels for long.
    """

    def __init__(self, processor: Qwen2_5_VLProcessorNoVideo, jitters: int, image_size: int):
        self.processor = processor
        self.image_size = image_size
        self.combos = list(itertools.product(*world.ATTRIBUTES.values()))
        self.index = {c: i for i, c in enumerate(self.combos)}
        self.jitters = jitters
        self.captions = [
            world.caption(dict(zip(world.ATTRIBUTE_NAMES, c, strict=True))) for c in self.combos
        ]
        self.patches = torch.empty(0)
        self.grid = torch.empty(0)

    def refresh(self, rng: np.random.Generator) -> None:
        """Render every combination with ``jitters`` fresh jitters and run the image processor."""
        images = []
        for _ in range(self.jitters):
            for c in self.combos:
                jitter = tuple(float(x) for x in rng.uniform(-1.0, 1.0, size=5))
                obj = world.SceneObject(*c, jitter=jitter)
                images.append(world.render(obj, self.image_size))
        out = self.processor.image_processor(images=images, return_tensors="pt")
        per = int(out["image_grid_thw"][0].prod())
        self.grid = out["image_grid_thw"][0]
        self.patches = out["pixel_values"].reshape(len(images), per, -1).to(torch.float16)

    def pick(self, combo: int, rng: np.random.Generator) -> int:
        """A pool row showing ``combo`` (one of its jitters)."""
        return int(rng.integers(self.jitters)) * len(self.combos) + combo

    def neighbours(self, combo: int) -> list[int]:
        """Combinations one attribute away (the adversarial negatives)."""
        c = self.combos[combo]
        out = []
        for a, values in enumerate(world.ATTRIBUTES.values()):
            out += [self.index[(*c[:a], v, *c[a + 1 :])] for v in values if v != c[a]]
        return out


class Encoder:
    """Token ids of the chat-templated prompts, built once per (N, caption) and cached."""

    def __init__(self, processor: Qwen2_5_VLProcessorNoVideo, tokens_per_image: int):
        tok = processor.tokenizer
        self.tok = tok
        self.cache: dict[tuple, list[int]] = {}
        self.image_pad = tok.convert_tokens_to_ids("<|image_pad|>")
        self.im_end = tok.convert_tokens_to_ids("<|im_end|>")
        self.head = tok.encode("<|im_start|>user\n", add_special_tokens=False)
        self.image = tok.encode(
            "<|vision_start|>" + "<|image_pad|>" * tokens_per_image + "<|vision_end|>",
            add_special_tokens=False,
        )
        self.tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        self.digits = [tok.convert_tokens_to_ids(str(i)) for i in range(1, 13)]
        self.label_ids = {
            name: [tok.convert_tokens_to_ids(c) for c in resolve_labels(name, 12)]
            for name in SCHEMES
        }

    def caption_ids(self, text: str) -> list[int]:
        """ids of a caption on its own."""
        return self.tok.encode(text, add_special_tokens=False)

    def prompt(self, n: int, text: str) -> list[int]:
        """ids of the generation prompt with n images then ``text`` (cached)."""
        key = (n, text)
        if key not in self.cache:
            body = self.tok.encode(text, add_special_tokens=False)
            self.cache[key] = self.head + self.image * n + body + self.tail
        return self.cache[key]


def _stack(rows: list[list[int]], label_from: int, encoder: Encoder) -> tuple[torch.Tensor, ...]:
    ids = torch.tensor(rows, dtype=torch.long)
    labels = ids.clone()
    labels[:, :label_from] = -100
    mm = (ids == encoder.image_pad).long()
    return ids, labels, mm


def caption_batch(pool: ImagePool, encoder: Encoder, size: int, rng: np.random.Generator):
    """Stage 1: one image -> its caption."""
    combos = rng.integers(len(pool.combos), size=size)
    rows, picks = [], []
    for c in combos:
        prompt = encoder.prompt(1, CAPTION_PROMPT)
        cap = encoder.tok.encode(pool.captions[c], add_special_tokens=False)
        rows.append(prompt + cap + [encoder.im_end])
        picks.append(pool.pick(int(c), rng))
    ids, labels, mm = _stack(rows, len(prompt), encoder)
    pixels = pool.patches[picks].reshape(-1, pool.patches.shape[-1]).float()
    return TrainBatch(ids, labels, mm, pixels, pool.grid.repeat(size, 1))


def retrieval_batch(
    pool: ImagePool,
    encoder: Encoder,
    size: int,
    n: int,
    hard: float,
    corruption: float,
    rng: np.random.Generator,
    scheme: str = "digits",
    corruption_shape: str = "edges",
) -> TrainBatch:
    """Stage 2: N candidates + caption -> label; the answer drawn from Q(. | GT position)."""
    q = CORRUPTIONS[corruption_shape](n, corruption)
    labels = resolve_labels(scheme, n)
    answer_ids = encoder.label_ids[scheme]
    rows, picks, gts = [], [], []
    for _ in range(size):
        target = int(rng.integers(len(pool.combos)))
        chosen = [target]
        near = pool.neighbours(target)
        rng.shuffle(near)
        while len(chosen) < n:
            hard_pick = bool(near) and rng.random() < hard
            c = near.pop() if hard_pick else int(rng.integers(len(pool.combos)))
            if c not in chosen:
                chosen.append(c)
        gt = int(rng.integers(n))
        negatives = chosen[1:]
        order = [*negatives[:gt], target, *negatives[gt:]]
        answer = int(rng.choice(n, p=q[gt]))
        prompt = encoder.prompt(n, prompt_text(pool.captions[target], labels))
        cap_len = len(encoder.caption_ids(pool.captions[target]))
        start = len(prompt) - len(encoder.tail) - 2 - cap_len  # 2: "Answer", ":"
        rows.append([*prompt, answer_ids[answer], encoder.im_end])
        picks += [pool.pick(c, rng) for c in order]
        gts.append(gt)
    ids, labels, mm = _stack(rows, len(prompt), encoder)
    head, block = len(encoder.head), len(encoder.image)
    spans = [(head + k * block, head + (k + 1) * block) for k in range(n)]
    pixels = pool.patches[picks].reshape(-1, pool.patches.shape[-1]).float()
    return TrainBatch(
        ids,
        labels,
        mm,
        pixels,
        pool.grid.repeat(size * n, 1),
        query_position=len(prompt) - 1,
        caption_start=start,
        image_spans=spans,
        gt_spans=gts,
    )
