"""``lad bench attention``: captured attention == eager attention on this device and dtype.

The runner reads the t_q attention row of the layers in Λ inside SDPA (``app.engine.
attention``); the reference is the same model switched to eager attention and run with
``output_attentions=True``. Both are reduced to the evidence the method uses, a (|Λ|, N)
matrix of per-image attention mass, and compared element by element. The test suite does
this on the CPU in float32 (tests/integration/engine/test_attention_capture.py); this
command repeats it where the service really runs (``--device cuda``, bf16), and states the
tolerance it holds the result to: the mass is a sum of softmax weights in [0, 1], and
bf16 keeps 8 bits of mantissa (relative step 2^-8 ~ 0.004) in both paths' inputs, so
``atol`` is 2e-2 for bfloat16/float16 and 1e-4 for float32 (TF32 and kernel order).
"""

from __future__ import annotations

import platform

import numpy as np

from app.cli_help import command_parser
from lad_lab.bench.results import write_record

TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 2e-2}
QUERY = "a small red circle at the top on a striped background"


MIN_SIDE = 16
"""Smallest image side tried when the requested one does not fit the model's context."""


def compare(model: str, device: str, dtype: str, n: int, side: int) -> dict:
    """Max |captured - eager| over layers and images for one request of ``n`` images. Where
    ``n`` images of ``side`` pixels do not fit the model's context (a tiny model's 2,048
    tokens), the side is halved until they do; the record says which side ran."""
    import torch

    from app.engine.attention import eager_attentions, span_mass
    from app.engine.interface import PromptTooLongError
    from lad_lab.bench import engine_setup

    engine_setup.DEVICE.update(device=device, dtype=dtype)
    asked = side
    while True:
        runner = engine_setup.build(model, side, threads=torch.get_num_threads())
        items = engine_setup.requests(n, side, QUERY)
        try:
            captured = runner.forward(items).attention[0]
            break
        except PromptTooLongError as exc:
            if side // 2 < MIN_SIDE:
                raise SystemExit(f"lad bench attention: {model}: {exc}") from None
            side //= 2
    if side != asked:
        print(f"{model}: --side {asked} does not fit its context; ran with --side {side}")
    batch = runner.process(items)
    spans = runner.adapter.image_spans(batch.input_ids[0], n)
    attentions = eager_attentions(runner.model, runner.adapter, batch, logits_to_keep=1)
    eager = span_mass(attentions, 0, -1, runner.layers, spans)
    diff = float(np.max(np.abs(captured - eager)))
    tol = TOLERANCE[dtype]
    return {
        "model": model,
        "device": device,
        "dtype": dtype,
        "n": n,
        "image_side": side,
        "prompt_tokens": int(batch.input_ids.shape[1]),
        "layers": list(runner.layers),
        "max_abs_diff": diff,
        "atol": tol,
        "ok": diff <= tol,
        "captured_mass_mean": float(captured.sum(axis=1).mean()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(prog="lad bench attention", description=__doc__)
    parser.add_argument("--models", default="demo,tiny-qwen2_5_vl")
    parser.add_argument("--device", default="cpu", help='"cpu" or "cuda"')
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--side", type=int, default=224, help="image side in pixels")
    parser.add_argument("--out", default="bench/results/attention_check.json")
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available on this machine")
    device_name = (
        torch.cuda.get_device_name(0)
        if args.device.startswith("cuda")
        else f"cpu ({platform.machine()})"
    )
    checks: list[dict] = []
    for model in args.models.split(","):
        for dtype in args.dtypes.split(","):
            check = compare(model, args.device, dtype, args.n, args.side)
            checks.append(check)
            verdict = "ok" if check["ok"] else "MISMATCH"
            print(
                f"{model:18s} {dtype:9s} {check['prompt_tokens']:6d} tokens  max |captured - "
                f"eager| = {check['max_abs_diff']:.2e} (atol {check['atol']:.0e})  {verdict}",
                flush=True,
            )
            write_record(
                args.out,
                {  # after every check: a run cut short keeps the rest
                    "command": "lad bench attention " + " ".join(argv or []),
                    "device": device_name,
                    "torch": torch.__version__,
                    "checks": checks,
                },
            )
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
