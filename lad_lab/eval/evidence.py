"""The model-facing half of the harness: batched forwards, calibration, and the records of
every method for one (n, setting) run.

Score methods share one forward per (item, ordering) and go through the engine's own
``apply_method`` (the service's dispatch); perm_avg adds the N − 1 other cyclic rotations;
``instruction`` is a forward with the instruction prompt on the same loaded model;
``cot`` and ``self_consistency`` generate through ``lad_lab.eval.generate``. Under the
paper protocol (``Options.answers``) vanilla and instruction are generated too: two greedy
tokens read by the authors' parser, a parse failure counted wrong. Calibration is
the engine's ``calibration_instances`` + ``estimate_calibration``, as in the service.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from app.engine.interface import RetrievalItem
from app.method import debias
from app.method.calibrate import Calibration, calibration_instances, estimate_calibration
from app.method.methods import METHODS, MULTI_PASS, MethodConfig, apply_method, passes
from lad_lab.eval.datasets import EvalItem, open_image
from lad_lab.eval.paper import OURS, GenerationSpec
from lad_lab.eval.protocol import apply_ordering, gt_positions
from lad_lab.eval.records import make_record

GENERATION_METHODS: tuple[str, ...] = ("cot", "self_consistency")
PROMPT_METHODS: tuple[str, ...] = ("instruction",)
EVAL_METHODS: tuple[str, ...] = (
    "vanilla",
    "pride",
    "attn_raw",
    "attn_pure",
    "agd",
    "perm_avg",
    *PROMPT_METHODS,
    *GENERATION_METHODS,
)
"""Every method ``lad eval`` runs: the engine's METHODS plus the prompt baselines."""
assert set(METHODS) <= set(EVAL_METHODS)

Tick = Callable[[int], None]
Instance = tuple[str, Sequence[Any]]


@dataclass(frozen=True)
class Options:
    """What one run needs besides the items: labels, batching, the method and baseline knobs."""

    labels: str = "digits"
    batch_size: int = 16
    config: MethodConfig = field(default_factory=MethodConfig)
    image_size: tuple[int, int] | None = None  # every image resized to (w, h), bicubic
    perm_orders: np.ndarray | None = None  # (K, N) perm_avg orders, identity first; None: cyclic
    cot: GenerationSpec = OURS.cot
    self_consistency: GenerationSpec = OURS.self_consistency
    answers: GenerationSpec | None = None  # vanilla / instruction generated (paper protocol)
    generation_seed: int = 0

    def engine_methods(self, methods: Sequence[str]) -> list[str]:
        """The methods of ``methods`` that read the shared forward's scores, in EVAL order."""
        generated = {"vanilla"} if self.answers is not None else set()
        return [m for m in EVAL_METHODS if m in methods and m in METHODS and m not in generated]


def prepare_image(image: Any, options: Options) -> Image.Image:
    """The image as the protocol shows it: opened, and resized when the protocol says so
    (a simulated candidate is no image: it goes to the simulated backend as it is)."""
    if not isinstance(image, Image.Image | Path | str):
        return image
    im = open_image(image)
    if options.image_size is not None and im.size != tuple(options.image_size):
        im = im.resize(tuple(options.image_size), Image.Resampling.BICUBIC)
    return im


def _items(chunk: Sequence[Instance], options: Options) -> list[RetrievalItem]:
    return [RetrievalItem(q, [prepare_image(im, options) for im in images]) for q, images in chunk]


def forward(
    runner: Any, instances: Sequence[Instance], options: Options, tick: Tick
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores (R, N), attention (R, |Λ|, N) and each instance's share of the wall time (R,) ms."""
    scores, attention, ms = [], [], []
    for start in range(0, len(instances), options.batch_size):
        chunk = instances[start : start + options.batch_size]
        began = time.perf_counter()
        out = runner.forward(_items(chunk, options), options.labels)
        share = (time.perf_counter() - began) * 1e3 / len(chunk)
        scores.extend(out.scores)
        attention.extend(out.attention)
        ms.extend([share] * len(chunk))
        tick(len(chunk))
    return np.stack(scores), np.stack(attention), np.asarray(ms)


def calibrate(
    runner: Any, items: Sequence[EvalItem], options: Options, tick: Tick
) -> tuple[Calibration, dict[str, Any]]:
    """DESIGN §2.3 on ``items``, and the evidence for calibration.json (to recompute B, P, κ̂)."""
    instances, gt = calibration_instances([(i.query, i.images, i.answer) for i in items])
    scores, attention, _ = forward(runner, instances, options, tick)
    evidence = {
        "items": [i.id for i in items],
        "scores": scores.tolist(),
        "attention": attention.tolist(),
        "gt_positions": gt.tolist(),
    }
    remote = getattr(runner, "service_calibration", None)
    if remote is not None:  # --url: the service's own /v1/calibrate decides B and P
        examples = [
            (i.query, [prepare_image(im, options) for im in i.images], i.answer) for i in items
        ]
        calibration = remote(examples, options.labels)
        evidence["service"] = {
            "bias_matrix": calibration.bias_matrix.tolist(),
            "attention_prior": calibration.attention_prior.tolist(),
        }
        return calibration, evidence
    return estimate_calibration(scores, attention, gt), evidence


@dataclass
class Run:
    """One (n, setting): the items, their orderings and the records written so far."""

    n: int
    setting: str
    dataset: str
    items: Sequence[EvalItem]
    orderings: np.ndarray  # (I, T, N)
    records: list[dict[str, Any]]

    @property
    def gt(self) -> np.ndarray:
        return gt_positions([i.answer for i in self.items], self.orderings)

    def instances(self, then: Sequence[int] | None = None) -> list[Instance]:
        """(query, images) of every (item, ordering), row-major; ``then`` reorders the shown
        images once more (a perm_avg order: position p shows shown[then[p]])."""
        out = []
        for item, perms in zip(self.items, self.orderings, strict=True):
            for perm in perms:
                shown = apply_ordering(item.images, perm)
                out.append((item.query, shown if then is None else apply_ordering(shown, then)))
        return out

    def add(
        self,
        method: str,
        probabilities: np.ndarray,
        passes_: int,
        ms: np.ndarray,
        predicted: Sequence[int | None] | None = None,
        generations: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """Records of ``method`` for every (item, ordering), in ``instances()`` order."""
        t = self.orderings.shape[1]
        gt = self.gt.ravel()
        for r, p in enumerate(probabilities):
            i, o = divmod(r, t)
            pred = int(np.argmax(p)) if predicted is None else predicted[r]
            self.records.append(
                self._images(i, o)
                | make_record(
                    item=self.items[i].id,
                    n=self.n,
                    setting=self.setting,
                    dataset=self.dataset,
                    ordering=o,
                    order=self.orderings[i, o],
                    method=method,
                    gt_position=gt[r],
                    probabilities=p,
                    predicted_position=pred,
                    forward_passes=passes_,
                    latency_ms=ms[r],
                    generation=None if generations is None else generations[r],
                )
            )

    def _images(self, i: int, o: int) -> dict[str, Any]:
        """``images``: the file names in the order shown, when the candidates are files."""
        shown = apply_ordering(self.items[i].images, self.orderings[i, o])
        if all(isinstance(im, Path) for im in shown):
            return {"images": [im.name for im in shown]}
        return {}


def score_methods(
    runner: Any,
    run: Run,
    calibration: Calibration,
    methods: Sequence[str],
    options: Options,
    tick: Tick,
) -> None:
    """Every engine method of ``methods`` on the run's instances (one shared forward)."""
    engine = options.engine_methods(methods)
    if not engine:
        return
    scores, attention, ms = forward(runner, run.instances(), options, tick)
    orders = perm_avg_orders(run.n, options)
    rotated = None
    if "perm_avg" in methods:
        rotated = [scores] + [
            forward(runner, run.instances(order), options, tick)[0] for order in orders[1:]
        ]
    for method in engine:
        began = time.perf_counter()
        out = apply_method(
            method,
            scores,
            attention,
            calibration,
            options.config,
            rotated_scores=None if rotated is None else np.stack(rotated, axis=1),
            orders=orders.tolist(),
        )
        method_ms = (time.perf_counter() - began) * 1e3 / len(scores)
        cost_passes = len(orders) if method in MULTI_PASS else passes(method, run.n)
        run.add(method, out.probabilities, cost_passes, ms * cost_passes + method_ms)


def perm_avg_orders(n: int, options: Options) -> np.ndarray:
    """(K, N): the orders perm_avg averages over, identity first (default: the N rotations)."""
    orders = np.asarray(
        debias.rotations(n) if options.perm_orders is None else options.perm_orders, dtype=np.int64
    )
    if orders.shape[1:] != (n,) or list(orders[0]) != list(range(n)):
        raise ValueError(f"perm_avg orders must be (K, {n}) with the identity first")
    return orders


def instruction(runner: Any, run: Run, options: Options, tick: Tick) -> None:
    """The instruction prompt (DESIGN §2.6) on the same model: vanilla's argmax s, or
    (paper protocol) its generated answer."""
    from app.engine.runner import Runner

    if options.answers is not None:
        spec_ = replace(options.answers, prompt_variant="instruction")
        generation(runner, run, "instruction", options, tick, spec_)
        return
    other = Runner(
        runner.adapter,
        model_id=runner.model_id,
        revision=runner.revision,
        layers=runner.layers,
        prompt_variant="instruction",
    )
    scores, _, ms = forward(other, run.instances(), options, tick)
    run.add("instruction", debias.softmax(scores), 1, ms)


def generation(
    runner: Any,
    run: Run,
    method: str,
    options: Options,
    tick: Tick,
    g_spec: GenerationSpec | None = None,
) -> None:
    """cot (one path), self_consistency (samples, majority vote) or a generated vanilla /
    instruction under its GenerationSpec (default: the protocol's for ``method``): its
    prompt, budget, sampling settings, inherited or explicit, and answer parser."""
    from app.engine.labels import prompt_text, resolve_labels
    from lad_lab.eval.answers import majority_vote, parse_answer_paper
    from lad_lab.eval.generate import generate_answers

    if g_spec is None:
        g_spec = options.self_consistency if method == "self_consistency" else options.cot
    labels = resolve_labels(options.labels, run.n)
    template = g_spec.prompt
    if g_spec.prompt_variant is not None:  # the score prompt, with its caption left open
        template = prompt_text("{query}", labels, g_spec.prompt_variant)
    instances = run.instances()
    probabilities, predicted, generations, ms, cost = [], [], [], [], []
    for start in range(0, len(instances), options.batch_size):
        chunk = instances[start : start + options.batch_size]
        outs = generate_answers(
            runner,
            _items(chunk, options),
            options.labels,
            template=template,
            samples=g_spec.samples,
            temperature=g_spec.temperature if g_spec.do_sample else 0.0,
            max_new_tokens=g_spec.max_new_tokens,
            top_k=g_spec.top_k,
            top_p=g_spec.top_p,
            seed=options.generation_seed + start,
            inherit=g_spec.inherit,
            eos=g_spec.eos,
        )
        for g in outs:
            answers = g.answers
            if g_spec.parser == "paper":
                answers = [
                    parse_answer_paper(t, labels, answer_is=method == "self_consistency")
                    for t in g.texts
                ]
            winner, shares = majority_vote(answers, run.n)
            if winner is None and g_spec.no_vote == "first":  # the authors answer "1"
                winner = 0
            probabilities.append(shares)
            predicted.append(winner)
            generations.append({"answers": answers, "text": g.texts[0]})
            ms.append(g.latency_ms)
            cost.append(g.forward_passes)
        tick(len(chunk))
    # forward passes differ per instance: record them one by one
    first = len(run.records)
    run.add(method, np.asarray(probabilities), 0, np.asarray(ms), predicted, generations)
    for record, passes_ in zip(run.records[first:], cost, strict=True):
        record["forward_passes"] = int(passes_)


def planned_forwards(
    methods: Sequence[str], n: int, instances: int, calibration: int, perm_orders: int | None = None
) -> int:
    """Instances the progress bar counts for one run (forwards, or generations);
    ``perm_orders``: K orders of perm_avg (default N)."""
    total = calibration * n + (instances if any(m in METHODS for m in methods) else 0)
    total += instances * ((perm_orders or n) - 1) if "perm_avg" in methods else 0
    return total + instances * sum(m in methods for m in (*PROMPT_METHODS, *GENERATION_METHODS))
