"""``lad eval`` end to end: datasets -> calibration -> balanced orderings -> every method ->
predictions.jsonl, calibration.json, metrics.json (computed from the records), report.md
and plots, for every (n, setting) asked.

``run_evaluation(runner, config)`` is the whole run on a loaded runner (tests pass a tiny
one); ``app.eval.cli`` parses the flags, loads the model and calls it.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.engine.methods import MethodConfig
from app.eval import plots, report
from app.eval.datasets import DEFAULT_SETTINGS, Dataset, check_disjoint, open_dataset
from app.eval.evidence import (
    GENERATION_METHODS,
    Options,
    Run,
    calibrate,
    generation,
    instruction,
    planned_forwards,
    score_methods,
)
from app.eval.metrics import compute_metrics
from app.eval.protocol import DEFAULT_ORDERINGS, balanced_count, item_orderings
from app.eval.records import run_key, write_records
from app.eval.stats import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED

DEFAULT_METHODS: tuple[str, ...] = ("vanilla", "pride", "attn_raw", "attn_pure", "agd", "perm_avg")


@dataclass
class EvalConfig:
    """Every flag of ``lad eval`` (see ``app.eval.cli`` for their help)."""

    out: Path
    model: str = "demo"
    dataset: str = "synthetic"
    data: Path | None = None
    images: Path | None = None
    instances: Path | None = None
    clip: Path | None = None
    cache_dir: Path = Path("var/cache")
    settings: list[str] | None = None
    ns: list[int] = field(default_factory=lambda: [4])
    items: int = 200
    orderings: int = DEFAULT_ORDERINGS
    calibration: int = 5
    eval_seed: int | None = None
    calibration_seed: int | None = None
    ordering_seed: int = 0
    calibration_setting: str | None = None
    calibration_dataset: str | None = None
    calibration_data: Path | None = None
    calibration_images: Path | None = None
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    labels: str = "digits"
    prompt_variant: str = "vanilla"
    layers: list[int] | None = None
    top_k: int = MethodConfig.top_k
    tau: float = MethodConfig.tau
    posterior_variant: str = MethodConfig.posterior_variant
    mixture: str = MethodConfig.mixture
    no_prior: bool = False
    sink_guard: bool = MethodConfig.sink_guard
    batch_size: int = 16
    threads: int | None = 1
    samples: int = 10
    temperature: float = 0.7
    generation_seed: int = 0
    cot_prompt: str | None = None
    cot_max_new_tokens: int = 64
    bootstrap: int = BOOTSTRAP_SAMPLES
    bootstrap_seed: int = BOOTSTRAP_SEED
    progress: bool = True
    command: str = ""
    # streaming mode (app.eval.stream)
    stream: bool = False
    feedback_rate: float = 0.3
    window: int = 100
    refresh_every: int = 50
    min_row_count: int = 20
    min_holdout: int = 20
    drift_prompt_variant: str | None = None
    prior_from: str = "feedback"

    def method_config(self) -> MethodConfig:
        return MethodConfig(
            top_k=self.top_k, tau=self.tau, posterior_variant=self.posterior_variant,
            mixture=self.mixture, sink_guard=self.sink_guard, use_prior=not self.no_prior,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


def _default_seeds(name: str) -> tuple[int, int]:
    """(evaluation, calibration) seeds: the world's eval / calibration splits for synthetic."""
    if name == "synthetic":
        from app.eval.datasets.synthetic import CALIBRATION_SEED, EVAL_SEED

        return EVAL_SEED, CALIBRATION_SEED
    return 1, 2


def _datasets(runner: Any, config: EvalConfig) -> tuple[Dataset, Dataset]:
    from app.eval.datasets.synthetic import image_size_for

    common = {"clip": config.clip, "cache_dir": config.cache_dir,
              "image_size": image_size_for(runner)}  # fmt: skip
    main = open_dataset(config.dataset, data=config.data, images=config.images,
                        instances=config.instances, **common)  # fmt: skip
    if config.calibration_dataset is None and config.calibration_data is None:
        return main, main
    other = open_dataset(
        config.calibration_dataset or config.dataset,
        data=config.calibration_data, images=config.calibration_images, **common,
    )  # fmt: skip
    return main, other


def _progress(config: EvalConfig, total: int, label: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="inst", file=sys.stderr,
                disable=not config.progress, dynamic_ncols=True)  # fmt: skip


def evaluate_run(runner: Any, config: EvalConfig, datasets: tuple[Dataset, Dataset],
                 n: int, setting: str) -> tuple[Run, dict[str, Any]]:  # fmt: skip
    """One (n, setting): calibrate, then score every method under balanced orderings."""
    main, other = datasets
    eval_seed, calibration_seed = config.eval_seed, config.calibration_seed
    if eval_seed is None or calibration_seed is None:
        raise ValueError("resolve the seeds first (run_evaluation does)")
    items = main.items(config.items, n, setting, eval_seed)
    if len(items) < config.items:
        print(f"lad eval: only {len(items)} items with N={n} in {main.name}", file=sys.stderr)
    calibration_setting = config.calibration_setting or setting
    calibration_items = other.items(config.calibration, n, calibration_setting, calibration_seed,
                                    exclude=frozenset(i.key for i in items))  # fmt: skip
    check_disjoint(items, calibration_items)
    if len(calibration_items) < config.calibration:
        raise ValueError(f"only {len(calibration_items)} calibration items outside the eval items")
    t = balanced_count(config.orderings, n)
    options = Options(
        labels=config.labels, batch_size=config.batch_size, config=config.method_config(),
        cot_prompt=config.cot_prompt, cot_max_new_tokens=config.cot_max_new_tokens,
        samples=config.samples, temperature=config.temperature,
        generation_seed=config.generation_seed,
    )  # fmt: skip
    total = planned_forwards(config.methods, n, len(items) * t, len(calibration_items))
    with _progress(config, total, f"N={n} {setting}") as bar:
        calibration, evidence = calibrate(runner, calibration_items, options, bar.update)
        run = Run(n, setting, main.name, items, item_orderings(n, len(items), t,
                  config.ordering_seed), [])  # fmt: skip
        score_methods(runner, run, calibration, config.methods, options, bar.update)
        if "instruction" in config.methods:
            instruction(runner, run, options, bar.update)
        for method in GENERATION_METHODS:
            if method in config.methods:
                generation(runner, run, method, options, bar.update)
    evidence.update(
        n=n, setting=calibration_setting, eval_setting=setting, dataset=other.name,
        layers=list(runner.layers), sink_guard=config.sink_guard,
    )  # fmt: skip
    return run, evidence


def run_evaluation(runner: Any, config: EvalConfig) -> dict[str, Any]:
    """Every (n, setting) of the config; writes the outputs into ``config.out``."""
    started = time.perf_counter()
    config.out.mkdir(parents=True, exist_ok=True)
    eval_seed, calibration_seed = _default_seeds(config.dataset)
    config.eval_seed = eval_seed if config.eval_seed is None else config.eval_seed
    if config.calibration_seed is None:
        config.calibration_seed = calibration_seed
    datasets = _datasets(runner, config)
    settings = config.settings or [DEFAULT_SETTINGS[config.dataset]]
    records: list[dict[str, Any]] = []
    calibrations: dict[str, Any] = {}
    for setting in settings:
        for n in config.ns:
            run, evidence = evaluate_run(runner, config, datasets, n, setting)
            records.extend(run.records)
            calibrations[run_key(n, setting)] = evidence
    write_records(config.out / "predictions.jsonl", records)
    (config.out / "calibration.json").write_text(json.dumps({"runs": calibrations}) + "\n")
    metrics = compute_metrics(records, calibrations, samples=config.bootstrap,
                              seed=config.bootstrap_seed)  # fmt: skip
    metrics["config"] = {
        **config.to_dict(), "model_fingerprint": _fingerprint(runner, config),
        "layers": list(runner.layers), "wall_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    (config.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    figures = plots.write_plots(metrics, config.out)
    (config.out / "report.md").write_text(report.render(metrics, figures))
    return metrics


def _fingerprint(runner: Any, config: EvalConfig) -> dict[str, Any] | None:
    try:
        return runner.fingerprint(config.labels, config.ns[0]).model_dump()
    except AttributeError:
        return None
