"""The two evaluation protocols of ``lad eval`` (design §2.11): "ours" and the authors' "paper".

A ``ProtocolSpec`` holds every setting in which the protocols differ: how the images are
prepared, the orderings, the perm_avg orders, the candidate layers Λ, and the prompts,
budgets and sampling of the generation baselines. ``spec(name)`` resolves one; the harness
reads its fields and never branches on the name. The "paper" values are the settings of
the authors' released code (brightXian/LAD): every image resized to 336 x 336 (bicubic),
InternVL capped at min(12, 28 // N) tiles, T = 5 orderings (the identity and 4 distinct
random permutations) shared by every item, perm_avg over 16 random orders, Λ = layers
21..35, and their CoT / self-consistency prompts (kept byte for byte: they are settings).
``PAPER_TABLES`` are the paper's published numbers, printed beside ours by
``lad reproduce``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

PROTOCOLS: tuple[str, ...] = ("ours", "paper")

# ours: the position-free wording (no label is named, so the prompt primes no position)
OURS_COT_PROMPT = (
    "Given {n} images {range}, identify the image that best matches the provided caption. "
    'Think step by step first, then end with the sentence "The answer is" followed by '
    "{noun} of the matching image.\n"
    "Caption: {query}\n"
    "Answer: "
)
"""The CoT and self-consistency text of the "ours" protocol."""

PAPER_COT_PROMPT = (
    "Given {n} images {range}, identify the image that best matches the provided caption.\n"
    "Please think step by step. First, write your reasoning inside <think> and </think> "
    "tags. Then, after the closing </think> tag, output only the final answer index "
    "(a single integer from {first} to {last}).\n"
    "Caption: {query}\n"
    "Answer: <think>"
)
"""The authors' CoT text (for digit labels byte for byte theirs)."""

PAPER_SC_PROMPT = (
    "Given {n} images {range}, identify the image that best matches the provided caption.\n"
    "Please think step by step to analyze the content of the images. "
    "After your reasoning, provide the final answer in the exact format: "
    '"The answer is <index>".\n'
    "Caption: {query}\n"
    "Answer: "
)
"""The authors' self-consistency text (byte for byte theirs for digit labels)."""


@dataclass(frozen=True)
class GenerationSpec:
    """Every setting of one generated answer. "ours": all passed explicitly to ``generate``
    (the checkpoint's generation_config set aside). ``inherit`` (the authors'): the
    checkpoint's generation_config stays and only these are passed; None: not passed."""

    prompt: str  # a CoT template (app.engine.labels.cot_prompt_text); see prompt_variant
    max_new_tokens: int
    do_sample: bool
    temperature: float = 1.0
    top_k: int | None = 0
    top_p: float | None = 1.0
    samples: int = 1
    parser: str = "ours"  # "ours": lad_lab.eval.answers.parse_answer; "paper": theirs
    no_vote: str = "wrong"  # self_consistency without a parsed answer: "wrong" or "first"
    inherit: bool = False  # keep the checkpoint's generation_config (the authors' calls)
    eos: str = "ours"  # end token passed: "ours", "tokenizer" or "config" (none passed)
    prompt_variant: str | None = None  # the §2.6 score prompt of this variant, not ``prompt``


@dataclass(frozen=True)
class ProtocolSpec:
    """What the protocol fixes; see the module docstring."""

    name: str
    image_size: tuple[int, int] | None  # resize every image to (w, h), bicubic; None: as is
    tile_cap: bool  # cap tiling processors (InternVL) at min(12, 28 // N) tiles
    orderings: str  # "balanced": per item, T a multiple of N; "shared": identity + random
    default_orderings: int
    perm_avg: str  # "cyclic": the N rotations; "random": identity + random orders
    perm_avg_orders: int
    layers: tuple[int, int] | None  # Λ = lo..hi (clipped to the depth); None: round(.58 L)..L-1
    cot: GenerationSpec
    self_consistency: GenerationSpec
    calibration: str  # where the M calibration items come from
    negatives: str  # the exclusion rule of COCO / Flickr negatives (datasets.base)
    benchmark: str = "ours"  # COCO items: "ours" (datasets.base) or "paper" (coco_paper)
    sink_guard: bool = True  # False: sink layers stay in L* whatever --sink-guard says
    answers: GenerationSpec | None = None  # vanilla / instruction generated; None: label argmax
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


OURS = ProtocolSpec(
    name="ours",
    image_size=None,
    tile_cap=False,
    orderings="balanced",
    default_orderings=4,
    perm_avg="cyclic",
    perm_avg_orders=0,
    layers=None,
    cot=GenerationSpec(OURS_COT_PROMPT, 1024, do_sample=False),
    self_consistency=GenerationSpec(
        OURS_COT_PROMPT, 512, do_sample=True, temperature=0.7, top_k=40, samples=10
    ),
    calibration="M items disjoint from the evaluation items (own seed)",
    negatives="ours",
)

PAPER_NOTES: tuple[str, ...] = (
    "calibration items: the authors calibrate on the first M evaluation items; here they "
    "are M items disjoint from the evaluation items (as the paper's text says)",
    "perm_avg orders are drawn once per run and shared by every instance (the authors "
    "draw them per instance)",
    "Λ: the authors' --layer-range 21 35, clipped to the model's depth",
    "sink guard off, as the authors have none (sink layers can enter L*)",
    "vanilla and instruction: two greedy tokens and the last number in 1..N of the text, "
    "a parse failure counted wrong (unparseable_pct in metrics.json); pride / agd read the "
    "restricted label log-probabilities of one forward (§2.1)",
    "generation (vanilla, instruction, cot, self_consistency): the checkpoint's "
    "generation_config stays and only the authors' settings are passed (greedy: "
    "temperature 1.0, num_beams 1; self_consistency: temperature 0.7, top_k 40, the "
    "tokenizer's eos and pad), so e.g. its top_p or repetition_penalty apply",
    "self_consistency draws its samples in one generate call (num_return_sequences), the "
    "authors in one call each: the same distribution, other random numbers",
    "pride / agd scores: the raw logits of one forward; the authors read generate's first "
    "step, after the checkpoint's logits processors (e.g. a repetition_penalty of the "
    "prompt's digits)",
    "one seed per stream (orderings, perm_avg, items, generation) instead of the authors' "
    "single random.seed / set_seed(42); COCO items (--benchmark paper) follow their "
    "builder's own random stream from --eval-seed (theirs: 42)",
    "COCO items (--benchmark paper): CLIP is transformers' CLIPModel from --clip in float32 "
    "(the authors: the openai clip package, float16 on a GPU), so near-tied adversarial "
    "neighbours can differ; captions longer than CLIP's context are truncated (theirs fail)",
)
"""Every remaining difference between ``--protocol paper`` and the authors' runs."""

PAPER_ANSWER = GenerationSpec(
    "", 2, do_sample=False, parser="paper", inherit=True, eos="config", prompt_variant="vanilla"
)
"""The authors' vanilla and instruction: two greedy tokens, the last number in 1..N."""

PAPER = ProtocolSpec(
    name="paper",
    image_size=(336, 336),
    tile_cap=True,
    orderings="shared",
    default_orderings=5,
    perm_avg="random",
    perm_avg_orders=16,
    layers=(21, 35),
    cot=GenerationSpec(
        PAPER_COT_PROMPT, 1024, do_sample=False, parser="paper", inherit=True, eos="config"
    ),
    self_consistency=GenerationSpec(
        PAPER_SC_PROMPT,
        512,
        do_sample=True,
        temperature=0.7,
        top_k=40,
        top_p=None,
        samples=10,
        parser="paper",
        no_vote="first",
        inherit=True,
        eos="tokenizer",
    ),
    calibration="M items disjoint from the evaluation items (own seed)",
    negatives="paper",
    benchmark="paper",
    sink_guard=False,
    answers=PAPER_ANSWER,
    notes=PAPER_NOTES,
)


def spec(name: str) -> ProtocolSpec:
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; use one of {PROTOCOLS}")
    return OURS if name == "ours" else PAPER


def tile_cap(n: int) -> int:
    """The authors' tile budget of one image among N: min(12, 28 // N), at least 1."""
    return max(1, min(12, 28 // max(n, 1)))


ORDERING_STREAM, PERM_AVG_STREAM = 0, 1
"""Separate random streams of one seed: the shared orderings and the perm_avg orders."""


def random_orders(n: int, count: int, seed: int, stream: int = ORDERING_STREAM) -> np.ndarray:
    """(K, N): the identity, then distinct random permutations; K = min(count, N!)."""
    k = min(count, math.factorial(n)) if n <= 12 else count
    rng = np.random.default_rng(np.random.SeedSequence([seed, n, stream]))
    orders = [tuple(range(n))]
    while len(orders) < k:
        perm = tuple(int(x) for x in rng.permutation(n))
        if perm not in orders:
            orders.append(perm)
    return np.asarray(orders, dtype=np.int64)


def shared_orderings(n: int, n_items: int, t: int, seed: int) -> np.ndarray:
    """(I, T, N): the same T orderings (identity first) for every item, as the authors do."""
    orders = random_orders(n, t, seed)
    return np.broadcast_to(orders, (n_items, *orders.shape)).copy()


def paper_layers(depth: int, layers: tuple[int, int] | None) -> list[int] | None:
    """Λ of a protocol for a model of ``depth`` layers: lo..min(hi, L-1); None when the
    protocol leaves it to the default, or the model is too shallow for the range."""
    if layers is None or depth <= layers[0]:
        return None
    return list(range(layers[0], min(layers[1], depth - 1) + 1))


PAPER_TABLES: dict[str, dict[str, dict[str, tuple[float, float, float]]]] = {
    # model -> "setting/method" -> (Acc, RStd, Cons), the paper's Table 1 (N = 4), 1,000 items
    "Qwen2.5-VL-3B": {
        "random/vanilla": (51.70, 36.27, 6.61),
        "random/instruction": (48.96, 35.80, 4.20),
        "random/cot": (54.16, 36.75, 8.20),
        "random/pride": (63.76, 36.24, 17.70),
        "random/self_consistency": (63.24, 20.35, 15.70),
        "random/agd": (94.94, 4.20, 84.30),
        "adversarial/vanilla": (38.04, 32.21, 4.10),
        "adversarial/instruction": (35.92, 33.76, 2.80),
        "adversarial/cot": (42.24, 18.85, 3.41),
        "adversarial/pride": (47.80, 28.80, 10.40),
        "adversarial/self_consistency": (42.20, 12.96, 3.70),
        "adversarial/agd": (65.72, 13.71, 40.90),
    },
    "LLaVA-OneVision-8B": {
        "random/vanilla": (67.52, 25.43, 19.90),
        "random/instruction": (50.50, 34.61, 5.90),
        "random/cot": (45.40, 34.15, 3.31),
        "random/pride": (68.00, 33.07, 32.10),
        "random/self_consistency": (41.90, 19.09, 0.00),
        "random/agd": (98.66, 0.88, 96.50),
        "adversarial/vanilla": (49.56, 16.62, 13.90),
        "adversarial/instruction": (39.22, 28.64, 3.90),
        "adversarial/cot": (36.24, 34.04, 2.71),
        "adversarial/pride": (53.84, 31.77, 20.80),
        "adversarial/self_consistency": (35.70, 11.63, 1.50),
        "adversarial/agd": (71.06, 10.23, 51.30),
        # Table 8 (perm_avg, accuracy only) and Table 4 (adversarial ablation)
        "random/perm_avg": (99.04, math.nan, math.nan),
        "adversarial/perm_avg": (74.32, math.nan, math.nan),
        "adversarial/attn_raw": (42.36, 37.65, 9.50),
        "adversarial/attn_pure": (64.38, 10.17, 45.30),
    },
    "InternVL3-8B": {
        "random/vanilla": (69.04, 28.38, 18.50),
        "random/instruction": (67.52, 26.27, 19.60),
        "random/cot": (77.96, 12.45, 37.70),
        "random/pride": (76.32, 18.33, 35.90),
        "random/self_consistency": (69.20, 24.06, 22.00),
        "random/agd": (94.84, 5.93, 80.70),
        "adversarial/vanilla": (61.00, 25.22, 19.00),
        "adversarial/instruction": (57.14, 29.95, 15.20),
        "adversarial/cot": (61.08, 14.13, 20.50),
        "adversarial/pride": (64.16, 20.65, 30.40),
        "adversarial/self_consistency": (61.70, 21.40, 20.00),
        "adversarial/agd": (76.64, 7.89, 54.10),
    },
}
"""Table 4's rows map to ours as: Attn Readout without prior = attn_raw, Attn Readout with
the static prior = attn_pure, Dynamic + prior, K = 2 = agd."""
