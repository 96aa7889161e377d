"""``EvalConfig``: every setting of a ``lad eval`` run, each written once.

A field declared with :func:`app.cli_help.flag` is also a command-line option: its default,
help text, choices and flag names live here, and ``lad_lab.eval.cli`` generates the parser from
them (``add_config_flags``), so the config and ``lad eval --help`` cannot disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from app.cli_help import cli_flag, flag
from app.engine.labels import PROMPT_VARIANTS, SCHEMES
from app.method.debias import MIXTURES, VARIANTS
from app.method.methods import MethodConfig
from lad_lab.eval.datasets import DATASETS
from lad_lab.eval.evidence import EVAL_METHODS
from lad_lab.eval.paper import PROTOCOLS, ProtocolSpec, random_orders, spec
from lad_lab.eval.protocol import balanced_count
from lad_lab.eval.stats import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED

DEFAULT_METHODS: tuple[str, ...] = ("vanilla", "pride", "attn_raw", "attn_pure", "agd", "perm_avg")

FLAG_GROUPS: dict[str, tuple[str, str | None]] = {
    "generation": ("generation baselines (default: the protocol's, all explicit)", None),
    "remote": ("a running service instead of a model (lad_lab/eval/remote.py)", None),
    "stream": ("streaming mode (online calibration, docs/evaluation.md)", None),
}
"""The option groups of ``lad eval --help`` (a Flag's ``group``), in their order there."""


def parse_layers(text: str) -> list[int]:
    """ "2,3" or "2-3" -> [2, 3]."""
    if "-" in text and "," not in text:
        lo, _, hi = text.partition("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(x) for x in text.split(",") if x.strip()]


@dataclass
class EvalConfig:
    """Every flag of ``lad eval`` (their order here is their order in --help)."""

    model: str = flag("demo", help='"demo", a hub name or a local path')
    dataset: str = flag("synthetic", choices=DATASETS, help="dataset reader")
    data: Path | None = flag(None, help="jsonl file, COCO captions JSON or Flickr captions file")
    images: Path | None = flag(None, help="image folder (coco, flickr)")
    instances: Path | None = flag(None, help="COCO instances JSON (category sets, optional)")
    clip: Path | None = flag(
        None, help="local CLIP directory: adversarial negatives of coco/flickr"
    )
    cache_dir: Path = flag(Path("var/cache"), help="CLIP embedding cache")
    settings: list[str] | None = flag(
        None,
        flags=("--setting",),
        help="random / adversarial (synthetic, coco, flickr), given (jsonl); one run each "
        "(default: the dataset's first)",
    )
    ns: list[int] = flag(factory=lambda: [4], flags=("-n", "--n"), help="candidates per item")
    protocol: str = flag(
        "ours",
        choices=PROTOCOLS,
        help="ours: balanced orderings, cyclic perm_avg; paper: the authors' settings (336 px "
        "bicubic, T = 5 shared orderings, perm_avg over 16 orders, their prompts)",
    )
    benchmark: str | None = flag(
        None,
        choices=("ours", "paper"),
        help="COCO items: ours (any image, a random caption, negatives in similarity order) "
        "or paper (the authors' construction: a 20,000-image pool, one caption per image, "
        "single-caption text cosine, shuffled; needs --instances); default: the protocol's",
    )
    dry_run: bool = flag(
        False, help="write protocol.json (forward passes included) and stop: no model is loaded"
    )
    items: int = flag(200, help="evaluation items per run")
    orderings: int | None = flag(
        None, help="T orderings per item (ours: 4, rounded up to a multiple of N; paper: 5)"
    )
    calibration: int = flag(5, help="M, calibration items")
    eval_seed: int | None = flag(
        None, help="seed of the evaluation items (default: 3003 for synthetic, else 1)"
    )
    item_seeds: list[int] | None = flag(
        None,
        help="run once per evaluation-item seed; seeds.md: mean and range over them beside "
        "the first seed's CI (lad_lab/eval/seeds.py)",
    )
    calibration_seed: int | None = flag(
        None, help="seed of the calibration items (default: 2002 for synthetic, else 2)"
    )
    ordering_seed: int = flag(0, help="seed of the orderings")
    calibration_setting: str | None = flag(None, help="calibrate on this setting (default: same)")
    calibration_dataset: str | None = flag(
        None, choices=DATASETS, help="calibrate on this dataset (default: the evaluation dataset)"
    )
    calibration_data: Path | None = flag(None, help="files of --calibration-dataset")
    calibration_images: Path | None = flag(None, help="image folder of --calibration-dataset")
    methods: list[str] = flag(
        factory=lambda: list(DEFAULT_METHODS), choices=EVAL_METHODS, help="methods to run"
    )
    labels: str = flag("digits", choices=SCHEMES, help="label scheme")
    prompt_variant: str = flag(
        "vanilla", choices=PROMPT_VARIANTS, help="prompt of every score method and of calibration"
    )
    layers: list[int] | None = flag(
        None,
        type=parse_layers,
        help="candidate layers Λ, e.g. 2,3 or 10-13 (default: round(0.58 L) .. L-1)",
    )
    top_k: int = flag(MethodConfig.top_k, help="K, layers in L*")
    tau: float = flag(MethodConfig.tau, help="posterior sharpening τ")
    posterior_variant: str = flag(
        MethodConfig.posterior_variant, choices=VARIANTS, help="§2.4 step 2"
    )
    mixture: str = flag(MethodConfig.mixture, choices=MIXTURES, help="§2.4 step 4")
    no_prior: bool = flag(False, help="posterior without the prior division (P = 1)")
    zero_bias: bool = flag(
        False, help="ablation: B = 0 after calibration (agd then corrects nothing)"
    )
    all_layers: bool = flag(
        False, help="ablation: L* = Λ, every candidate layer averaged (instead of the top K)"
    )
    sink_guard: bool = flag(
        MethodConfig.sink_guard,
        help="keep sink layers (prior < 1e-6 somewhere) in L*: the reference math "
        "(--protocol paper: always, the authors have no guard)",
    )
    batch_size: int = flag(16, help="instances per forward")
    threads: int | None = flag(1, help="torch CPU threads")
    samples: int | None = flag(None, group="generation", help="self_consistency samples (10)")
    temperature: float | None = flag(
        None, group="generation", help="self_consistency temperature (0.7)"
    )
    sc_top_k: int | None = flag(None, group="generation", help="self_consistency top-k (40)")
    generation_seed: int = flag(0, group="generation", help="seed of the sampling")
    cot_prompt: str | None = flag(
        None, group="generation", help="text of cot and self_consistency (default: the protocol's)"
    )
    cot_max_new_tokens: int | None = flag(None, group="generation", help="cot budget (1024)")
    sc_max_new_tokens: int | None = flag(
        None, group="generation", help="self_consistency budget per sample (512)"
    )
    bootstrap: int = flag(BOOTSTRAP_SAMPLES, help="item-bootstrap resamples")
    bootstrap_seed: int = flag(BOOTSTRAP_SEED, help="seed of the bootstrap")
    out: Path = flag(Path("runs/eval"), help="output folder")
    progress: bool = flag(True, flags=("--quiet",), help="no progress bar")
    url: str | None = flag(
        None,
        group="remote",
        help="evaluate the service at URL (one /v1/retrieve with return_details per instance; "
        "calibrated by /v1/calibrate)",
    )
    concurrency: int = flag(8, group="remote", help="requests in flight at once")
    token: str | None = flag(
        None, group="remote", secret=True, help="API token (Authorization: Bearer)"
    )
    admin_token: str | None = flag(
        None, group="remote", secret=True, help="admin token for /v1/calibrate"
    )
    stream: bool = flag(
        False,
        group="stream",
        help="replay --items as traffic (first -n and --setting) with feedback and online refresh",
    )
    feedback_rate: float = flag(0.3, group="stream", help="share of requests that get feedback")
    window: int = flag(100, group="stream", help="requests per window")
    refresh_every: int = flag(50, group="stream", help="refresh after this much new feedback")
    min_row_count: int = flag(20, group="stream", help="feedback a row of L_obs needs to be used")
    min_holdout: int = flag(20, group="stream", help="held-out feedback the guard needs")
    prior_from: str = flag(
        "feedback",
        group="stream",
        choices=("feedback", "served"),
        help="refresh's prior P: feedback or every request",
    )
    drift_prompt_variant: str | None = flag(
        None,
        group="stream",
        choices=PROMPT_VARIANTS,
        help="calibrate the drifted start with this prompt variant (with --calibration-setting: "
        "on that setting)",
    )
    command: str = ""  # the command line, for the records (not an option itself)

    def method_config(self) -> MethodConfig:
        return MethodConfig(
            top_k=self.top_k,
            tau=self.tau,
            posterior_variant=self.posterior_variant,
            mixture=self.mixture,
            sink_guard=self.sink_guard and spec(self.protocol).sink_guard,
            use_prior=not self.no_prior,
        )

    def to_dict(self) -> dict[str, Any]:
        """The flags for metrics.json (the tokens of --url never)."""
        return {
            k: str(v) if isinstance(v, Path) else v
            for k, v in asdict(self).items()
            if k not in SECRET_FLAGS
        }

    def protocol_spec(self) -> ProtocolSpec:
        """The protocol's settings with the flags that override them (None: keep)."""
        base = spec(self.protocol)

        def fill(g: Any, **values: Any) -> Any:
            return replace(g, **{k: v for k, v in values.items() if v is not None})

        return replace(
            base,
            cot=fill(base.cot, prompt=self.cot_prompt, max_new_tokens=self.cot_max_new_tokens),
            self_consistency=fill(
                base.self_consistency,
                prompt=self.cot_prompt,
                samples=self.samples,
                max_new_tokens=self.sc_max_new_tokens,
                temperature=self.temperature,
                top_k=self.sc_top_k,
            ),
        )

    def benchmark_name(self) -> str:
        """How COCO items are built: --benchmark, else the protocol's."""
        return self.benchmark or spec(self.protocol).benchmark

    def ordering_count(self, n: int) -> int:
        """T actually used at N: balanced (a multiple of N) or the shared count (<= N!)."""
        p = spec(self.protocol)
        t = p.default_orderings if self.orderings is None else self.orderings
        if p.orderings == "balanced":
            return balanced_count(t, n)
        return len(random_orders(n, t, self.ordering_seed))


SECRET_FLAGS = frozenset(
    f.name for f in fields(EvalConfig) if (spec_ := cli_flag(f)) is not None and spec_.secret
)
"""Fields never written into metrics.json (the tokens of --url)."""
