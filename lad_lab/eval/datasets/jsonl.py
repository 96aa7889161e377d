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

from lad_lab.eval.datasets.base import EvalItem, InputError, check_setting, read_text

FORMAT = '"query": "...", "images": ["a.jpg", ...], "answer": 0'
"""One line of the format, for the messages."""


class JsonlDataset:
    name = "jsonl"
    settings: tuple[str, ...] = ("given",)

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.source = str(self.path)
        self.lines: list[dict] = []
        seen: dict[tuple[Path, str], str] = {}
        for number, line in enumerate(read_text(self.path, "items file").splitlines(), 1):
            if not line.strip():
                continue
            row = self._row(line, number)
            where = f"{self.path}:{number}: item {row['id']}"
            for image in row["images"]:
                if not image.is_file():
                    raise InputError(
                        f"{where}: image file {image} not found; fix the path (relative to "
                        f"{self.path.parent}) or remove the line"
                    )
            key = (row["images"][row["answer"]], row["query"])
            if key in seen:
                raise InputError(
                    f"{where}: the same matching image and query as {seen[key]}; remove one "
                    "(a repeated item would be drawn twice, or as its own calibration item)"
                )
            seen[key] = f"line {number}"
            self.lines.append(row)
        if not self.lines:
            raise InputError(f"{self.path} holds no items (one JSON object per line)")

    def _row(self, line: str, number: int) -> dict:
        """One line as a checked item, or an InputError naming the line and the fix."""
        at = f"{self.path}:{number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{at}: not a JSON object ({exc})") from None
        if not isinstance(row, dict):
            raise InputError(f"{at}: not a JSON object; write {{{FORMAT}}}")
        missing = [k for k in ("query", "images", "answer") if k not in row]
        if missing:
            raise InputError(f"{at}: no {', '.join(missing)}; write {{{FORMAT}}}")
        item = f"{at}: item {row.get('id', number)}"
        query, images, answer = row["query"], row["images"], row["answer"]
        if not isinstance(query, str) or not query.strip():
            raise InputError(f'{item}: "query" must be a non-empty string')
        if (
            not isinstance(images, list)
            or not images
            or not all(isinstance(p, str) for p in images)
        ):
            raise InputError(f'{item}: "images" must be a non-empty list of file paths')
        if isinstance(answer, bool) or not isinstance(answer, int):
            raise InputError(
                f'{item}: "answer" must be the 0-based index (an integer) of the matching '
                f'image in "images", got {answer!r}'
            )
        if not 0 <= answer < len(images):
            raise InputError(
                f'{item}: "answer" {answer} is not an index of its {len(images)} images; use '
                f"0..{len(images) - 1} (0-based)"
            )
        return {
            "id": str(row.get("id", number)),
            "query": query,
            "images": [(self.path.parent / p).resolve() for p in images],
            "answer": answer,
        }

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
