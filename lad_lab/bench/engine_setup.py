"""Where ``lad bench engine``'s runners come from: the model (demo, tiny-<family>,
shape:<name> or a checkpoint) on the chosen device, dtype and width, its image processor
pinned to a side that gives the wanted prompt length, and the timed requests."""

from __future__ import annotations

from typing import Any

DEVICE: dict[str, Any] = {"device": "cpu", "dtype": "float32", "width": None}
"""Where, in which dtype and (``shape:`` models) at which width the runners are built
(``--device``, ``--dtype``, ``--width``)."""
SHAPE_PREFIX = "shape:"


def model_options(parser: Any, threads: int = 2) -> None:
    """The options that say which runner a bench builds, where and in which dtype."""
    parser.add_argument("--model", default="tiny", help="tiny-<family> or shape:<name>")
    parser.add_argument("--width", type=int, help="shape: models: the text hidden size")
    parser.add_argument("--threads", type=int, default=threads, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help='"cpu" or "cuda"')
    parser.add_argument("--dtype", default="float32", help="float32 or bfloat16")


def record_tag(model: str, width: int | None) -> str:
    """The record's file-name tag: tiny_qwen2_5_vl, shape_qwen2_5_vl-3b_w256, ..."""
    tag = model.replace("shape:", "shape_").replace("tiny-", "tiny_")
    tag = "tiny_qwen2_5_vl" if tag == "tiny" else tag
    return tag + (f"_w{width}" if width else "")


def set_side(runner, side: int) -> bool:
    """Pin a Qwen-style image processor to side x side pixels per image; False (nothing
    changed) for processors with a fixed tile size (InternVL, LLaVA-OneVision), whose
    image tokens do not depend on the side."""
    image_processor = runner.processor.image_processor
    if not hasattr(image_processor, "merge_size"):
        return False
    image_processor.size = {"shortest_edge": side * side, "longest_edge": side * side}
    return True


def build(model: str, side: int, threads: int):
    """A runner whose image processor yields (side/28)^2 tokens per image."""
    import torch

    from app.models.loader import resolve_device, resolve_dtype

    torch.set_num_threads(threads)
    device = resolve_device(DEVICE["device"])
    dtype = resolve_dtype(DEVICE["dtype"], device)
    if model.startswith("tiny"):
        from lad_lab.testing.tiny_models import tiny_runner

        family = model.removeprefix("tiny-") if model != "tiny" else "qwen2_5_vl"
        runner = tiny_runner(family, image_pixels=side)
        runner.model.to(device=device, dtype=dtype)
        return runner
    if model.startswith(SHAPE_PREFIX):
        from lad_lab.testing.shapes import shape_runner

        runner = shape_runner(model, width=DEVICE["width"], dtype=dtype, device=str(device))
        set_side(runner, side)
        return runner
    from app.models.loader import load_runner

    runner = load_runner(model, threads=threads, device=device, dtype=dtype)
    set_side(runner, side)
    return runner


def sync() -> None:
    """Wait for the device (CUDA runs asynchronously: a timing must include its kernels)."""
    import torch

    if DEVICE["device"].startswith("cuda"):
        torch.cuda.synchronize()


QUERY = "a small red circle at the top on a striped background"


def requests(n: int, side: int, query: str = QUERY, count: int = 1) -> list:
    """``count`` distinct requests of ``n`` random side x side images (the first the same
    whatever the count)."""
    from app.engine.interface import RetrievalItem
    from lad_lab.testing.tiny_models import random_images

    return [
        RetrievalItem(query, random_images(n, seed=n + 1000 * k, sizes=[(side, side)]))
        for k in range(count)
    ]


def side_for(model: str, target: int, n: int, threads: int) -> tuple[int, int]:
    """The image side (multiple of 28) whose prompt length is closest to ``target`` tokens
    (one runner; only its processor's size changes between tries)."""
    best = (0, 0)
    runner = build(model, 28, threads)
    for side in range(28, 28 * 80, 28):
        if not set_side(runner, side):  # fixed tiles: the tokens do not depend on the side
            return side, int(runner.process(requests(n, side)).input_ids.shape[1])
        tokens = int(runner.process(requests(n, side)).input_ids.shape[1])
        if not best[0] or abs(tokens - target) < abs(best[1] - target):
            best = (side, tokens)
        if tokens > target:
            break
    return best
