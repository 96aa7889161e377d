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
from typing import Any

from app.cli_help import add_config_flags, command_parser
from lad_lab.eval.config import FLAG_GROUPS, EvalConfig


def build_parser(prog: str = "lad eval") -> argparse.ArgumentParser:
    p = command_parser(
        prog=prog,
        description=__doc__,
        raw_description=True,
        epilog="`lad eval rerank --help`: the windowed tournament of /v1/rerank and the "
        "profiles of one n=all calibration against per-N ones (lad_lab/eval/rerank.py)",
    )
    add_config_flags(p, EvalConfig, FLAG_GROUPS)
    return p


def config_from(argv: list[str], prog: str = "lad eval") -> EvalConfig:
    """The config of one command line: the parser's namespace is the config's arguments."""
    args = vars(build_parser(prog).parse_args(argv))
    return EvalConfig(**args, command=f"{prog} {shlex.join(argv)}")


def main(argv: list[str] | None = None, prog: str = "lad eval") -> int:
    """Parse, load the model, run, print the headline table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["rerank"]:  # lad eval rerank: tournaments and any-N calibration
        from lad_lab.eval.rerank import main as rerank_main

        return rerank_main(argv[1:])
    config = config_from(argv, prog)
    from lad_lab.eval.datasets import InputError

    try:
        return _main(config)
    except InputError as exc:  # a mistake in the user's files or flags: one line
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2


def demo_main(argv: list[str] | None = None) -> int:
    """``lad demo eval``: this command under the demo's name (the demo world is the default
    dataset). It lives here, above the demo, so the demo package imports no evaluator."""
    return main(argv, prog="lad demo eval")


def _main(config: EvalConfig) -> int:
    """The run of one parsed command line (see ``main``)."""
    from lad_lab.eval.harness import run_evaluation
    from lad_lab.eval.protocol_record import resolve_layers

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
            print(
                f"N={run['n']} {run['setting']}: {len(run['items'])} items x "
                f"{run['orderings']['count']} orderings, {f['prompt_forwards']} prompt "
                f"forwards, at most {f['decode_steps_at_most']} decode steps"
            )
        print(f"{config.out}/protocol.json (dry run: no model loaded)")
        return 0
    from app.models.loader import load_runner
    from app.settings import Settings

    settings = Settings()  # the device map and the remote-code opt-in, as lad serve reads them
    runner = load_runner(
        config.model,
        layers=config.layers,
        prompt_variant=config.prompt_variant,
        threads=config.threads,
        device_map=settings.device_map,
        trust_remote_code=settings.trust_remote_code,
    )
    if config.stream:
        return _stream(runner, config)
    return _evaluate(runner, config)


NEEDS_TEXT_MODEL = ("instruction", "cot", "self_consistency")
"""Methods that prompt or generate with the loaded model itself (no remote or simulated run)."""


def _evaluate(backend: Any, config: EvalConfig, note: str = "") -> int:
    """One run, or one per --item-seeds with seeds.md, on a runner or another backend."""
    from lad_lab.eval.harness import run_evaluation

    if config.item_seeds:
        from lad_lab.eval.seeds import run_seeds

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
    from lad_lab.eval.datasets.simulated import SimulatedBackend

    _refuse(
        config,
        " --dataset simulated",
        config.layers is not None,
        "the simulation has no text model and fixes its own Λ (15 layers)",
    )
    return _evaluate(
        SimulatedBackend(),
        config,
        "(a SIMULATION: scores and attention drawn by lad_lab.eval.datasets.simulated)",
    )


def _remote(config: EvalConfig) -> int:
    """--url: the service's evidence instead of an in-process model."""
    from lad_client import LadClient
    from lad_lab.eval.remote import RemoteBackend

    _refuse(config, " --url", config.layers is not None, "the service decides its prompt and Λ")
    with LadClient(
        config.url, token=config.token, admin_token=config.admin_token, retries=5, timeout=600.0
    ) as client:
        return _evaluate(RemoteBackend(client, concurrency=config.concurrency), config)


def _print(metrics: dict[str, Any], config: EvalConfig) -> None:
    for run in metrics["runs"]:
        print(
            f"\nN={run['n']} {run['setting']}: {run['items']} items x {run['orderings']} orderings"
        )
        for name, m in run["methods"].items():
            print(
                f"  {name:17s} acc {m['acc']:5.1f} [{m['acc_ci'][0]:5.1f}, "
                f"{m['acc_ci'][1]:5.1f}]  RStd {m['rstd']:5.1f} (floor "
                f"{m['rstd_noise_floor']:4.1f})  cons {m['cons']:5.1f}"
            )
    print(f"\n{config.out}/report.md  ({metrics['config']['wall_s']} s)")


def _stream(runner: object, config: EvalConfig) -> int:
    from lad_lab.eval.stream import StreamSetup, run_stream

    drift = None
    if config.drift_prompt_variant is not None:
        from app.engine.runner import Runner

        r: Any = runner  # the same loaded model, another prompt (as the instruction baseline)
        drift = Runner(
            r.adapter,
            model_id=r.model_id,
            revision=r.revision,
            layers=r.layers,
            prompt_variant=config.drift_prompt_variant,
        )
    setup = StreamSetup(
        feedback_rate=config.feedback_rate,
        window=config.window,
        refresh_every=config.refresh_every,
        min_row_count=config.min_row_count,
        min_holdout=config.min_holdout,
        seed=config.ordering_seed,
        bootstrap=config.bootstrap,
        prior=config.prior_from,
    )
    result = run_stream(runner, config, setup, drift_runner=drift)
    s = result["summary"]
    print(
        f"last {s['tail_requests']} requests: "
        + ", ".join(f"{m} {v:.1f}" for m, v in s["acc"].items())
    )
    gap, got = f"{s['gap_points']:+.1f} {s['gap_ci']}", f"{s['recovered_points']:+.1f}"
    print(
        f"gap {gap}, recovered {got} {s['recovered_ci']}, share {s['recovered_share']} "
        f"{s['recovered_share_ci']}"
    )
    print(f"{config.out}/stream.md  ({result['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
