"""Your own data: one JSON object per line, ``{"query": str, "images": [paths], "answer": int}``.

Paths are relative to the file; ``answer`` is the 0-based index of the matching image;
an optional ``"id"`` names the item (default: its line number). A line with more than N
images gives an N-candidate item of the answer plus N − 1 of its other images (seeded, as
DESIGN §2.9); a line with fewer than N images is skipped. The negatives are the ones you
wrote, so the one setting is "given".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.eval.datasets.base import EvalItem, check_setting


class JsonlDataset:
    name = "jsonl"
    settings: tuple[str, ...] = ("given",)

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lines: list[dict] = []
        for number, line in enumerate(self.path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                query, images, answer = row["query"], row["images"], int(row["answer"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{self.path}:{number}: not an item ({exc})") from None
            if not isinstance(query, str) or not isinstance(images, list) or not images:
                raise ValueError(f"{self.path}:{number}: need a query string and a list of images")
            if not 0 <= answer < len(images):
                raise ValueError(f"{self.path}:{number}: answer {answer} is not an image index")
            paths = [(self.path.parent / p).resolve() for p in images]
            self.lines.append(
                {
                    "id": str(row.get("id", number)),
                    "query": query,
                    "images": paths,
                    "answer": answer,
                }
            )
        if not self.lines:
            raise ValueError(f"{self.path} holds no items")

    def items(
        self, count: int, n: int, setting: str, seed: int, exclude: frozenset[str] = frozenset()
    ) -> list[EvalItem]:
        check_setting(self, setting)
        out: list[EvalItem] = []
        for index in np.random.default_rng(seed).permutation(len(self.lines)):
            if len(out) == count:
                break
            row = self.lines[int(index)]
            key = f"{row['images'][row['answer']]}|{row['query']}"
            if len(row["images"]) < n or key in exclude:
                continue
            rng = np.random.default_rng(np.random.SeedSequence([seed, int(index)]))
            others = [i for i in range(len(row["images"])) if i != row["answer"]]
            keep = sorted([row["answer"], *rng.choice(others, size=n - 1, replace=False).tolist()])
            out.append(
                EvalItem(
                    f"jsonl/{row['id']}",
                    row["query"],
                    [row["images"][i] for i in keep],
                    keep.index(row["answer"]),
                    key,
                )
            )
        return out
