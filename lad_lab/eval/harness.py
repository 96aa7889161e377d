"""``lad eval`` end to end: datasets -> calibration -> balanced orderings -> every method ->
predictions.jsonl, calibration.json, metrics.json (computed from the records), report.md
and plots, for every (n, setting) asked.

``run_evaluation(runner, config)`` is the whole run on a loaded runner (tests pass a tiny
one); ``lad_lab.eval.cli`` parses the flags, loads the model and calls it.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from lad_lab.eval import plots, report
from lad_lab.eval.config import EvalConfig
from lad_lab.eval.datasets import (
    DEFAULT_SETTINGS,
    Dataset,
    InputError,
    check_disjoint,
    check_images,
    open_dataset,
)
from lad_lab.eval.evidence import (
    GENERATION_METHODS,
    Options,
    Run,
    calibrate,
    generation,
    instruction,
    planned_forwards,
    score_methods,
)
from lad_lab.eval.metrics import compute_metrics
from lad_lab.eval.paper import PERM_AVG_STREAM, random_orders, shared_orderings, spec
from lad_lab.eval.protocol import item_orderings
from lad_lab.eval.protocol_record import protocol_entry, tile_budget, write_protocol
from lad_lab.eval.records import run_key, write_records

AUTHORS_SEED = 42
"""The authors' builder's --seed: the default item seed of ``--benchmark paper``."""


def _default_seeds(name: str, benchmark: str = "ours") -> tuple[int, int]:
    """(evaluation, calibration) seeds: the world's eval / calibration splits for synthetic,
    the authors' 42 for their COCO construction."""
    if name == "coco" and benchmark == "paper":
        return AUTHORS_SEED, 2
    if name == "synthetic":
        from lad_lab.eval.datasets.synthetic import CALIBRATION_SEED, EVAL_SEED

        return EVAL_SEED, CALIBRATION_SEED
    return 1, 2


def _datasets(runner: Any, config: EvalConfig) -> tuple[Dataset, Dataset]:
    from lad_lab.eval.datasets.synthetic import image_size_for

    common = {
        "clip": config.clip,
        "cache_dir": config.cache_dir,
        "image_size": image_size_for(runner),
        "negatives": spec(config.protocol).negatives,
    }
    main = open_dataset(
        config.dataset,
        data=config.data,
        images=config.images,
        instances=config.instances,
        benchmark=config.benchmark_name() if config.dataset == "coco" else "ours",
        **common,
    )
    if config.calibration_dataset is None and config.calibration_data is None:
        return main, main
    other = open_dataset(
        config.calibration_dataset or config.dataset,
        data=config.calibration_data,
        images=config.calibration_images,
        **common,
    )
    return main, other


def _progress(config: EvalConfig, total: int, label: str) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=label,
        unit="inst",
        file=sys.stderr,
        disable=not config.progress,
        dynamic_ncols=True,
    )


@dataclass
class RunPlan:
    """One (n, setting) resolved before any forward: the items, orderings and options."""

    n: int
    setting: str
    calibration_setting: str
    items: list[Any]
    calibration_items: list[Any]
    orderings: Any  # (I, T, N)
    options: Options
    calibration_dataset: str


def plan_run(
    config: EvalConfig, datasets: tuple[Dataset, Dataset], n: int, setting: str
) -> RunPlan:
    """Draw the items and calibration items, and fix the orderings and options of one run."""
    main, other = datasets
    eval_seed, calibration_seed = config.eval_seed, config.calibration_seed
    if eval_seed is None or calibration_seed is None:
        raise ValueError("resolve the seeds first (run_evaluation does)")
    items = main.items(config.items, n, setting, eval_seed)
    if len(items) < config.items:
        print(f"lad eval: only {len(items)} items with N={n} in {main.name}", file=sys.stderr)
    calibration_setting = config.calibration_setting or setting
    calibration_items = other.items(
        config.calibration,
        n,
        calibration_setting,
        calibration_seed,
        exclude=frozenset(i.key for i in items),
    )
    check_disjoint(items, calibration_items)
    if len(calibration_items) < config.calibration:
        raise InputError(
            f"{getattr(other, 'source', other.name)}: only {len(calibration_items)} of the "
            f"--calibration {config.calibration} items with N={n} are left outside the "
            f"{len(items)} evaluation items (an item whose matching image is evaluated is "
            "never a calibration item); lower --items or --calibration, or add items"
        )
    for dataset, drawn in ((main, items), (other, calibration_items)):
        check_images(drawn, getattr(dataset, "source", dataset.name))
    p = config.protocol_spec()
    t = config.ordering_count(n)
    if p.orderings == "balanced":
        orderings = item_orderings(n, len(items), t, config.ordering_seed)
    else:
        orderings = shared_orderings(n, len(items), t, config.ordering_seed)
    perm_orders = None
    if p.perm_avg == "random":
        perm_orders = random_orders(n, p.perm_avg_orders, config.ordering_seed, PERM_AVG_STREAM)
    options = Options(
        labels=config.labels,
        batch_size=config.batch_size,
        config=config.method_config(),
        image_size=p.image_size,
        perm_orders=perm_orders,
        cot=p.cot,
        self_consistency=p.self_consistency,
        answers=p.answers,
        generation_seed=config.generation_seed,
    )
    return RunPlan(
        n, setting, calibration_setting, items, calibration_items, orderings, options, other.name
    )


def evaluate_run(
    runner: Any, config: EvalConfig, dataset: str, plan: RunPlan
) -> tuple[Run, dict[str, Any]]:
    """One planned (n, setting): calibrate, then score every method under its orderings."""
    n, options = plan.n, plan.options
    if config.all_layers:  # ablation: L* = Λ (every candidate layer averaged)
        options = replace(options, config=replace(options.config, top_k=len(runner.layers)))
    instances = plan.orderings.shape[0] * plan.orderings.shape[1]
    k = None if options.perm_orders is None else len(options.perm_orders)
    total = planned_forwards(config.methods, n, instances, len(plan.calibration_items), k)
    total += instances * (options.answers is not None and "vanilla" in config.methods)
    spec_ = config.protocol_spec()
    with (
        _progress(config, total, f"N={n} {plan.setting}") as bar,
        tile_budget(runner, n, spec_.tile_cap),
    ):
        calibration, evidence = calibrate(runner, plan.calibration_items, options, bar.update)
        if config.zero_bias:  # ablation: B = 0 (agd keeps π but corrects nothing)
            calibration = replace(calibration, bias_matrix=0.0 * calibration.bias_matrix)
        run = Run(n, plan.setting, dataset, plan.items, plan.orderings, [])
        score_methods(runner, run, calibration, config.methods, options, bar.update)
        if options.answers is not None and "vanilla" in config.methods:  # paper: generated
            generation(runner, run, "vanilla", options, bar.update, options.answers)
        if "instruction" in config.methods:
            instruction(runner, run, options, bar.update)
        for method in GENERATION_METHODS:
            if method in config.methods:
                generation(runner, run, method, options, bar.update)
    evidence.update(
        n=n,
        setting=plan.calibration_setting,
        eval_setting=plan.setting,
        dataset=plan.calibration_dataset,
        layers=list(runner.layers),
        sink_guard=config.method_config().sink_guard,
    )
    return run, evidence


def run_evaluation(runner: Any, config: EvalConfig) -> dict[str, Any]:
    """Every (n, setting) of the config; writes the outputs into ``config.out``.

    protocol.json (every setting that decides the numbers) is written first; with
    ``config.dry_run`` (or no runner) that is all, and no model is needed."""
    started = time.perf_counter()
    config.out.mkdir(parents=True, exist_ok=True)
    eval_seed, calibration_seed = _default_seeds(config.dataset, config.benchmark_name())
    config.eval_seed = eval_seed if config.eval_seed is None else config.eval_seed
    if config.calibration_seed is None:
        config.calibration_seed = calibration_seed
    datasets = _datasets(runner, config)
    settings = config.settings or [DEFAULT_SETTINGS[config.dataset]]
    plans = [plan_run(config, datasets, n, s) for s in settings for n in config.ns]
    write_protocol(
        config.out / "protocol.json",
        config,
        runner,
        [protocol_entry(config, runner, p) for p in plans],
    )
    if config.dry_run or runner is None:
        return {"dry_run": True, "protocol": str(config.out / "protocol.json")}
    records: list[dict[str, Any]] = []
    calibrations: dict[str, Any] = {}
    for plan in plans:
        run, evidence = evaluate_run(runner, config, datasets[0].name, plan)
        records.extend(run.records)
        calibrations[run_key(plan.n, plan.setting)] = evidence
    write_records(config.out / "predictions.jsonl", records)
    (config.out / "calibration.json").write_text(json.dumps({"runs": calibrations}) + "\n")
    metrics = compute_metrics(
        records, calibrations, samples=config.bootstrap, seed=config.bootstrap_seed
    )
    metrics["config"] = {
        **config.to_dict(),
        "model_fingerprint": _fingerprint(runner, config),
        "layers": list(runner.layers),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    (config.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    figures = plots.write_plots(metrics, config.out)
    (config.out / "report.md").write_text(report.render(metrics, figures))
    return metrics


def _fingerprint(runner: Any, config: EvalConfig) -> dict[str, Any] | None:
    try:
        return runner.fingerprint(config.labels, config.ns[0]).model_dump()
    except AttributeError:
        return None
