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
from dataclasses import asdict, dataclass, field, replace
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
from app.eval.paper import PERM_AVG_STREAM, ProtocolSpec, random_orders, shared_orderings, spec
from app.eval.protocol import balanced_count, item_orderings
from app.eval.protocol_record import protocol_entry, tile_budget, write_protocol
from app.eval.records import run_key, write_records
from app.eval.stats import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED

DEFAULT_METHODS: tuple[str, ...] = ("vanilla", "pride", "attn_raw", "attn_pure", "agd", "perm_avg")


SECRET_FLAGS = frozenset({"token", "admin_token"})


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
    protocol: str = "ours"
    dry_run: bool = False
    items: int = 200
    orderings: int | None = None
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
    item_seeds: list[int] | None = None
    url: str | None = None
    concurrency: int = 8
    token: str | None = None
    admin_token: str | None = None
    zero_bias: bool = False
    all_layers: bool = False
    sink_guard: bool = MethodConfig.sink_guard
    batch_size: int = 16
    threads: int | None = 1
    samples: int | None = None
    temperature: float | None = None
    sc_top_k: int | None = None
    generation_seed: int = 0
    cot_prompt: str | None = None
    cot_max_new_tokens: int | None = None
    sc_max_new_tokens: int | None = None
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
        """The flags for metrics.json (the tokens of --url never)."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()
                if k not in SECRET_FLAGS}  # fmt: skip

    def protocol_spec(self) -> ProtocolSpec:
        """The protocol's settings with the flags that override them (None: keep)."""
        base = spec(self.protocol)

        def fill(g: Any, **values: Any) -> Any:
            return replace(g, **{k: v for k, v in values.items() if v is not None})

        return replace(
            base,
            cot=fill(base.cot, prompt=self.cot_prompt, max_new_tokens=self.cot_max_new_tokens),
            self_consistency=fill(
                base.self_consistency, prompt=self.cot_prompt, samples=self.samples,
                max_new_tokens=self.sc_max_new_tokens, temperature=self.temperature,
                top_k=self.sc_top_k,
            ),
        )  # fmt: skip

    def ordering_count(self, n: int) -> int:
        """T actually used at N: balanced (a multiple of N) or the shared count (<= N!)."""
        p = spec(self.protocol)
        t = p.default_orderings if self.orderings is None else self.orderings
        if p.orderings == "balanced":
            return balanced_count(t, n)
        return len(random_orders(n, t, self.ordering_seed))


def _default_seeds(name: str) -> tuple[int, int]:
    """(evaluation, calibration) seeds: the world's eval / calibration splits for synthetic."""
    if name == "synthetic":
        from app.eval.datasets.synthetic import CALIBRATION_SEED, EVAL_SEED

        return EVAL_SEED, CALIBRATION_SEED
    return 1, 2


def _datasets(runner: Any, config: EvalConfig) -> tuple[Dataset, Dataset]:
    from app.eval.datasets.synthetic import image_size_for

    common = {"clip": config.clip, "cache_dir": config.cache_dir,
              "image_size": image_size_for(runner),
              "negatives": spec(config.protocol).negatives}  # fmt: skip
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


def plan_run(config: EvalConfig, datasets: tuple[Dataset, Dataset], n: int,
             setting: str) -> RunPlan:  # fmt: skip
    """Draw the items and calibration items, and fix the orderings and options of one run."""
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
        labels=config.labels, batch_size=config.batch_size, config=config.method_config(),
        image_size=p.image_size, perm_orders=perm_orders, cot=p.cot,
        self_consistency=p.self_consistency, generation_seed=config.generation_seed,
    )  # fmt: skip
    return RunPlan(n, setting, calibration_setting, items, calibration_items, orderings,
                   options, other.name)  # fmt: skip


def evaluate_run(runner: Any, config: EvalConfig, dataset: str,
                 plan: RunPlan) -> tuple[Run, dict[str, Any]]:  # fmt: skip
    """One planned (n, setting): calibrate, then score every method under its orderings."""
    n, options = plan.n, plan.options
    if config.all_layers:  # ablation: L* = Λ (every candidate layer averaged)
        options = replace(options, config=replace(options.config, top_k=len(runner.layers)))
    instances = plan.orderings.shape[0] * plan.orderings.shape[1]
    k = None if options.perm_orders is None else len(options.perm_orders)
    total = planned_forwards(config.methods, n, instances, len(plan.calibration_items), k)
    spec_ = config.protocol_spec()
    with _progress(config, total, f"N={n} {plan.setting}") as bar, \
            tile_budget(runner, n, spec_.tile_cap):  # fmt: skip
        calibration, evidence = calibrate(runner, plan.calibration_items, options, bar.update)
        if config.zero_bias:  # ablation: B = 0 (agd keeps π but corrects nothing)
            calibration = replace(calibration, bias_matrix=0.0 * calibration.bias_matrix)
        run = Run(n, plan.setting, dataset, plan.items, plan.orderings, [])
        score_methods(runner, run, calibration, config.methods, options, bar.update)
        if "instruction" in config.methods:
            instruction(runner, run, options, bar.update)
        for method in GENERATION_METHODS:
            if method in config.methods:
                generation(runner, run, method, options, bar.update)
    evidence.update(
        n=n, setting=plan.calibration_setting, eval_setting=plan.setting,
        dataset=plan.calibration_dataset, layers=list(runner.layers), sink_guard=config.sink_guard,
    )  # fmt: skip
    return run, evidence


def run_evaluation(runner: Any, config: EvalConfig) -> dict[str, Any]:
    """Every (n, setting) of the config; writes the outputs into ``config.out``.

    protocol.json (every setting that decides the numbers) is written first; with
    ``config.dry_run`` (or no runner) that is all, and no model is needed."""
    started = time.perf_counter()
    config.out.mkdir(parents=True, exist_ok=True)
    eval_seed, calibration_seed = _default_seeds(config.dataset)
    config.eval_seed = eval_seed if config.eval_seed is None else config.eval_seed
    if config.calibration_seed is None:
        config.calibration_seed = calibration_seed
    datasets = _datasets(runner, config)
    settings = config.settings or [DEFAULT_SETTINGS[config.dataset]]
    plans = [plan_run(config, datasets, n, s) for s in settings for n in config.ns]
    write_protocol(config.out / "protocol.json", config, runner,
                   [protocol_entry(config, runner, p) for p in plans])  # fmt: skip
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
