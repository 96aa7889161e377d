"""The example images of the documentation, rendered from the demo model's synthetic world.

The pages' curl and Python examples send these files to a service on the demo model, so
they are scenes of the world that model was trained on (lad_lab/demo/world.py: one shape of
one colour, size and position on a textured background), each named after its caption.
tests/e2e/test_doc_examples.py checks that the demo model answers every example query with
its intended image (vanilla and agd).

    python -m tools.render_examples --write   # (re)render examples/images/*.png
    python -m tools.render_examples --check   # exit 1 when a file differs from its scene
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

from app.cli_help import command_parser
from lad_lab.demo.world import SceneObject, caption, render

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "examples" / "images"
IMAGE_SIZE = 56  # the demo model's own image size (lad_lab/demo/world.py)

# (shape, colour, size, position, background) of each example image
CANDIDATES: tuple[tuple[str, str, str, str, str], ...] = (
    ("circle", "red", "large", "top", "plain"),
    ("square", "blue", "large", "bottom", "striped"),
    ("triangle", "green", "large", "left", "dotted"),
    ("star", "yellow", "large", "right", "checkered"),
    ("diamond", "purple", "large", "center", "plain"),
    ("cross", "orange", "large", "top", "dotted"),
    ("circle", "blue", "small", "right", "checkered"),
    ("square", "yellow", "small", "left", "striped"),
)
"""The candidates of the retrieve (the first four) and rerank (all eight) examples."""

CALIBRATION: tuple[tuple[str, str, str, str, str], ...] = (
    ("circle", "green", "small", "bottom", "checkered"),
    ("square", "orange", "small", "left", "plain"),
    ("star", "purple", "small", "top", "striped"),
    ("triangle", "red", "small", "center", "dotted"),
)
"""The images of the calibration examples (never a candidate of the other examples)."""


def scene(values: tuple[str, str, str, str, str]) -> SceneObject:
    shape, colour, size, position, background = values
    return SceneObject(
        shape=shape, colour=colour, size=size, position=position, background=background
    )


def file_name(obj: SceneObject) -> str:
    """``large-red-circle-top-plain.png``: the caption's attributes, in caption order."""
    return f"{obj.size}-{obj.colour}-{obj.shape}-{obj.position}-{obj.background}.png"


def images() -> dict[str, tuple[str, Image.Image]]:
    """Every example file name -> (its caption, its image)."""
    objects = [scene(v) for v in (*CANDIDATES, *CALIBRATION)]
    return {file_name(o): (caption(o), render(o, IMAGE_SIZE)) for o in objects}


def _same(path: Path, image: Image.Image) -> bool:
    """Whether ``path`` holds exactly ``image``'s pixels (PNG bytes may differ by encoder)."""
    if not path.is_file():
        return False
    with Image.open(path) as stored:
        return np.array_equal(np.asarray(stored.convert("RGB")), np.asarray(image))


def main(argv: list[str] | None = None) -> int:
    parser = command_parser(
        prog="python -m tools.render_examples", description=__doc__, raw_description=True
    )
    parser.add_argument("--write", action="store_true", help="write examples/images/*.png")
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    args = parser.parse_args(argv)
    stale = []
    for name, (text, image) in images().items():
        path = FOLDER / name
        if args.write:
            FOLDER.mkdir(parents=True, exist_ok=True)
            image.save(path, optimize=True)
        elif args.check and not _same(path, image):
            stale.append(name)
        print(f"{name}\t{text}")
    if stale:
        print(
            f"stale: {', '.join(stale)}; run `python -m tools.render_examples --write`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
