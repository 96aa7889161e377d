"""Flickr8k / Flickr30k: a captions file and the image folder.

Accepted caption files: the original token files (``name.jpg#0<TAB>caption``, Flickr8k.token.txt
and results_20130124.token), and CSV with a header (``image,caption`` or the pipe-separated
``image_name| comment_number| comment``).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lad_lab.eval.datasets.base import ImagePool, PoolImage, read_text


def _rows(path: Path) -> list[tuple[str, str]]:
    lines = [line for line in read_text(path, "captions file").splitlines() if line.strip()]
    if lines and "\t" in lines[0]:
        split = (line.partition("\t") for line in lines)
        return [(name.split("#")[0], text) for name, _, text in split]
    delimiter = "|" if "|" in lines[0] else ","
    reader = csv.reader(lines[1:], delimiter=delimiter)
    return [(row[0].strip(), row[-1].strip()) for row in reader if len(row) >= 2]


def read_flickr(captions: Path, images_dir: Path) -> list[PoolImage]:
    """The captioned images of a Flickr captions file, in file-name order."""
    texts: dict[str, list[str]] = defaultdict(list)
    for name, text in _rows(captions):
        if name and text:
            texts[name].append(text)
    return [PoolImage(Path(images_dir) / name, tuple(texts[name])) for name in sorted(texts)]


def flickr_dataset(
    captions: Path,
    images_dir: Path,
    embed: Callable[[list[Path]], np.ndarray] | None = None,
    **rule: Any,
) -> ImagePool:
    pool = read_flickr(captions, images_dir)
    neighbours = None if embed is None else (lambda: embed([p.path for p in pool]))
    dataset = ImagePool("flickr", pool, neighbours, **rule)
    dataset.source = str(captions)
    return dataset
