"""``lad eval``: measure position bias and its correction on a dataset, with honest statistics.

Calibrates on M items, evaluates every method on held-out items under balanced orderings
(the GT at every position equally often) and writes predictions.jsonl, calibration.json,
metrics.json (95% item-bootstrap CIs, paired differences, RStd noise floor, diagnostics),
report.md and PNG plots into --out. Examples:

    lad eval --dataset synthetic --setting random adversarial -n 4 8 --out runs/demo
    lad eval --dataset jsonl --data my_items.jsonl -n 4 --out runs/mine
    lad eval --dataset coco --data captions_val2017.json --images val2017 \\
        --instances instances_val2017.json --clip ./clip-vit-b32 --setting adversarial

Heavy imports (torch, transformers, matplotlib) happen after parsing, so --help is fast.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from app.cli_help import command_parser
from app.engine.debias import MIXTURES, VARIANTS
from app.engine.labels import SCHEMES
from app.engine.methods import MethodConfig
from app.engine.prompts import PROMPT_VARIANTS
from app.eval.datasets import DATASETS
from app.eval.evidence import EVAL_METHODS
from app.eval.harness import DEFAULT_METHODS, EvalConfig
from app.eval.paper import PROTOCOLS


def _layers(text: str) -> list[int]:
    """ "2,3" or "2-3" -> [2, 3]."""
    if "-" in text and "," not in text:
        lo, _, hi = text.partition("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(x) for x in text.split(",") if x.strip()]


def build_parser(prog: str = "lad eval") -> argparse.ArgumentParser:
    p = command_parser(
        prog=prog,
        description=__doc__,
        raw_description=True,
        epilog="`lad eval rerank --help`: the windowed tournament of /v1/rerank and the "
        "profiles of one n=all calibration against per-N ones (app/eval/rerank.py)",
    )
    d = " (default: %(default)s)"
    add = p.add_argument
    add("--model", default="demo", help='"demo", a hub name or a local path' + d)
    add("--dataset", choices=DATASETS, default="synthetic", help="dataset reader" + d)
    add("--data", type=Path, help="jsonl file, COCO captions JSON or Flickr captions file")
    add("--images", type=Path, help="image folder (coco, flickr)")
    add("--instances", type=Path, help="COCO instances JSON (category sets, optional)")
    add("--clip", type=Path, help="local CLIP directory: adversarial negatives of coco/flickr")
    add("--cache-dir", type=Path, default=Path("var/cache"), help="CLIP embedding cache" + d)
    add("--setting", nargs="+", dest="settings", default=None,
        help="random / adversarial (synthetic, coco, flickr), given (jsonl); one run each "
        "(default: the dataset's first)")  # fmt: skip
    add("-n", "--n", nargs="+", type=int, dest="ns", default=[4], help="candidates per item" + d)
    add("--protocol", choices=PROTOCOLS, default="ours",
        help="ours: balanced orderings, cyclic perm_avg; paper: the authors' settings (336 px "
        "bicubic, T = 5 shared orderings, perm_avg over 16 orders, their prompts)" + d)  # fmt: skip
    add(
        "--dry-run",
        action="store_true",
        help="write protocol.json (forward passes included) and stop: no model is loaded",
    )
    add("--items", type=int, default=200, help="evaluation items per run" + d)
    add("--orderings", type=int, default=None,
        help="T orderings per item (ours: 4, rounded up to a multiple of N; paper: 5)")  # fmt: skip
    add("--calibration", type=int, default=5, help="M, calibration items" + d)
    add("--eval-seed", type=int, default=None,
        help="seed of the evaluation items (default: 3003 for synthetic, else 1)")  # fmt: skip
    add("--item-seeds", type=int, nargs="+", default=None,
        help="run once per evaluation-item seed; seeds.md: mean and range over them beside "
        "the first seed's CI (app/eval/seeds.py)")  # fmt: skip
    add("--calibration-seed", type=int, default=None,
        help="seed of the calibration items (default: 2002 for synthetic, else 2)")  # fmt: skip
    add("--ordering-seed", type=int, default=0, help="seed of the orderings" + d)
    add("--calibration-setting", default=None, help="calibrate on this setting (default: same)")
    add("--calibration-dataset", choices=DATASETS, default=None,
        help="calibrate on this dataset (default: the evaluation dataset)")  # fmt: skip
    add("--calibration-data", type=Path, help="files of --calibration-dataset")
    add("--calibration-images", type=Path, help="image folder of --calibration-dataset")
    add("--methods", nargs="+", choices=EVAL_METHODS, default=list(DEFAULT_METHODS),
        help="methods to run" + d)  # fmt: skip
    add("--labels", choices=SCHEMES, default="digits", help="label scheme" + d)
    add("--prompt-variant", choices=PROMPT_VARIANTS, default="vanilla",
        help="prompt of every score method and of calibration" + d)  # fmt: skip
    add("--layers", type=_layers, default=None, help="candidate layers Λ, e.g. 2,3 or 10-13 "
        "(default: round(0.58 L) .. L-1)")  # fmt: skip
    add("--top-k", type=int, default=MethodConfig.top_k, help="K, layers in L*" + d)
    add("--tau", type=float, default=MethodConfig.tau, help="posterior sharpening τ" + d)
    add("--posterior-variant", choices=VARIANTS, default=MethodConfig.posterior_variant,
        help="§2.4 step 2" + d)  # fmt: skip
    add("--mixture", choices=MIXTURES, default=MethodConfig.mixture, help="§2.4 step 4" + d)
    add("--no-prior", action="store_true", help="posterior without the prior division (P = 1)")
    add("--zero-bias", action="store_true",
        help="ablation: B = 0 after calibration (agd then corrects nothing)")  # fmt: skip
    add("--all-layers", action="store_true",
        help="ablation: L* = Λ, every candidate layer averaged (instead of the top K)")  # fmt: skip
    add("--no-sink-guard", dest="sink_guard", action="store_false",
        help="keep sink layers (prior < 1e-6 somewhere) in L*: the reference math")  # fmt: skip
    add("--batch-size", type=int, default=16, help="instances per forward" + d)
    add("--threads", type=int, default=1, help="torch CPU threads" + d)
    g = p.add_argument_group("generation baselines (default: the protocol's, all explicit)")
    g.add_argument("--samples", type=int, default=None, help="self_consistency samples (10)")
    g.add_argument("--temperature", type=float, default=None,
                   help="self_consistency temperature (0.7)")  # fmt: skip
    g.add_argument("--sc-top-k", type=int, default=None, help="self_consistency top-k (40)")
    g.add_argument("--generation-seed", type=int, default=0, help="seed of the sampling" + d)
    g.add_argument("--cot-prompt", default=None,
                   help="text of cot and self_consistency (default: the protocol's)")  # fmt: skip
    g.add_argument("--cot-max-new-tokens", type=int, default=None, help="cot budget (1024)")
    g.add_argument("--sc-max-new-tokens", type=int, default=None,
                   help="self_consistency budget per sample (512)")  # fmt: skip
    add("--bootstrap", type=int, default=2000, help="item-bootstrap resamples" + d)
    add("--bootstrap-seed", type=int, default=0, help="seed of the bootstrap" + d)
    add("--out", type=Path, default=Path("runs/eval"), help="output folder" + d)
    add("--quiet", action="store_true", help="no progress bar")
    remote = p.add_argument_group("a running service instead of a model (app/eval/remote.py)")
    remote.add_argument("--url", default=None,
                        help="evaluate the service at URL (one /v1/retrieve with "
                        "return_details per instance; calibrated by /v1/calibrate)")  # fmt: skip
    remote.add_argument("--concurrency", type=int, default=8,
                        help="requests in flight at once" + d)  # fmt: skip
    remote.add_argument("--token", default=None, help="API token (Authorization: Bearer)")
    remote.add_argument("--admin-token", default=None, help="admin token for /v1/calibrate")
    stream = p.add_argument_group("streaming mode (online calibration, docs/evaluation.md)")
    stream.add_argument("--stream", action="store_true", help="replay --items as traffic "
                        "(first -n and --setting) with feedback and online refresh")  # fmt: skip
    stream.add_argument("--feedback-rate", type=float, default=0.3,
                        help="share of requests that get feedback" + d)  # fmt: skip
    stream.add_argument("--window", type=int, default=100, help="requests per window" + d)
    stream.add_argument("--refresh-every", type=int, default=50,
                        help="refresh after this much new feedback" + d)  # fmt: skip
    stream.add_argument("--min-row-count", type=int, default=20,
                        help="feedback a row of L_obs needs to be used" + d)  # fmt: skip
    stream.add_argument("--min-holdout", type=int, default=20,
                        help="held-out feedback the guard needs" + d)  # fmt: skip
    stream.add_argument("--prior-from", choices=("feedback", "served"), default="feedback",
                        help="refresh's prior P: feedback or every request" + d)  # fmt: skip
    stream.add_argument("--drift-prompt-variant", choices=PROMPT_VARIANTS, default=None,
                        help="calibrate the drifted start with this prompt variant "
                        "(with --calibration-setting: on that setting)")  # fmt: skip
    return p


def config_from(argv: list[str], prog: str = "lad eval") -> EvalConfig:
    args = vars(build_parser(prog).parse_args(argv))
    quiet = args.pop("quiet")
    return EvalConfig(**args, progress=not quiet,
                      command=f"{prog} {shlex.join(argv)}")  # fmt: skip


def main(argv: list[str] | None = None, prog: str = "lad eval") -> int:
    """Parse, load the model, run, print the headline table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["rerank"]:  # lad eval rerank: tournaments and any-N calibration
        from app.eval.rerank import main as rerank_main

        return rerank_main(argv[1:])
    config = config_from(argv, prog)
    from app.eval.harness import run_evaluation
    from app.eval.protocol_record import resolve_layers

    if config.dataset == "simulated" and not config.dry_run:
        return _simulated(config)
    if config.url is not None and not config.dry_run:
        return _remote(config)
    config.layers = resolve_layers(config)
    if config.dry_run:
        run_evaluation(None, config)
        doc = json.loads((config.out / "protocol.json").read_text())
        for run in doc["runs"]:
            f = run["forward_passes"]
            exact = f"{f['total']}" if f["total"] is not None else f"at most {f['total_at_most']}"
            print(f"N={run['n']} {run['setting']}: {len(run['items'])} items x "
                  f"{run['orderings']['count']} orderings, {exact} forward passes")  # fmt: skip
        print(f"{config.out}/protocol.json (dry run: no model loaded)")
        return 0
    from app.models.loader import load_runner
    from app.settings import Settings

    settings = Settings()  # the device map and the remote-code opt-in, as lad serve reads them
    runner = load_runner(config.model, layers=config.layers, prompt_variant=config.prompt_variant,
                         threads=config.threads, device_map=settings.device_map,
                         trust_remote_code=settings.trust_remote_code)  # fmt: skip
    if config.stream:
        return _stream(runner, config)
    return _evaluate(runner, config)


NEEDS_TEXT_MODEL = ("instruction", "cot", "self_consistency")
"""Methods that prompt or generate with the loaded model itself (no remote or simulated run)."""


def _evaluate(backend: Any, config: EvalConfig, note: str = "") -> int:
    """One run, or one per --item-seeds with seeds.md, on a runner or another backend."""
    from app.eval.harness import run_evaluation

    if config.item_seeds:
        from app.eval.seeds import run_seeds

        run_seeds(backend, config, config.item_seeds)
        print(f"{config.out}/seeds.md {note}")
    else:
        _print(run_evaluation(backend, config), config)
        print(note)
    return 0


def _refuse(config: EvalConfig, where: str, also: bool, why: str) -> None:
    """Exit with a clear message when a flag or method needs an in-process model."""
    needs = [m for m in config.methods if m in NEEDS_TEXT_MODEL]
    if needs or config.stream or also:
        what = ", ".join(needs) or "--stream / --layers"
        raise SystemExit(f"lad eval{where}: {what} need an in-process model; {why}")


def _simulated(config: EvalConfig) -> int:
    """--dataset simulated: the score-level simulation's backend instead of a model."""
    from app.eval.datasets.simulated import SimulatedBackend

    _refuse(config, " --dataset simulated", config.layers is not None,
            "the simulation has no text model and fixes its own Λ (15 layers)")  # fmt: skip
    return _evaluate(SimulatedBackend(), config,
                     "(a SIMULATION: scores and attention drawn by app.eval.datasets.simulated)")


def _remote(config: EvalConfig) -> int:
    """--url: the service's evidence instead of an in-process model."""
    from app.client import LadClient
    from app.eval.remote import RemoteBackend

    _refuse(config, " --url", config.layers is not None, "the service decides its prompt and Λ")
    with LadClient(config.url, token=config.token, admin_token=config.admin_token,
                   retries=5, timeout=600.0) as client:  # fmt: skip
        return _evaluate(RemoteBackend(client, concurrency=config.concurrency), config)


def _print(metrics: dict[str, Any], config: EvalConfig) -> None:
    for run in metrics["runs"]:
        print(f"\nN={run['n']} {run['setting']}: {run['items']} items x {run['orderings']} "
              "orderings")  # fmt: skip
        for name, m in run["methods"].items():
            print(f"  {name:17s} acc {m['acc']:5.1f} [{m['acc_ci'][0]:5.1f}, "
                  f"{m['acc_ci'][1]:5.1f}]  RStd {m['rstd']:5.1f} (floor "
                  f"{m['rstd_noise_floor']:4.1f})  cons {m['cons']:5.1f}")  # fmt: skip
    print(f"\n{config.out}/report.md  ({metrics['config']['wall_s']} s)")


def _stream(runner: object, config: EvalConfig) -> int:
    from app.eval.stream import StreamSetup, run_stream

    drift = None
    if config.drift_prompt_variant is not None:
        from app.engine.runner import Runner

        r: Any = runner  # the same loaded model, another prompt (as the instruction baseline)
        drift = Runner(r.adapter, model_id=r.model_id, revision=r.revision, layers=r.layers,
                       prompt_variant=config.drift_prompt_variant)  # fmt: skip
    setup = StreamSetup(
        feedback_rate=config.feedback_rate, window=config.window,
        refresh_every=config.refresh_every, min_row_count=config.min_row_count,
        min_holdout=config.min_holdout, seed=config.ordering_seed, bootstrap=config.bootstrap,
        prior=config.prior_from,
    )  # fmt: skip
    result = run_stream(runner, config, setup, drift_runner=drift)
    s = result["summary"]
    print(f"last {s['tail_requests']} requests: " + ", ".join(
        f"{m} {v:.1f}" for m, v in s["acc"].items()))  # fmt: skip
    gap, got = f"{s['gap_points']:+.1f} {s['gap_ci']}", f"{s['recovered_points']:+.1f}"
    print(f"gap {gap}, recovered {got} {s['recovered_ci']}, share {s['recovered_share']} "
          f"{s['recovered_share_ci']}")  # fmt: skip
    print(f"{config.out}/stream.md  ({result['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
