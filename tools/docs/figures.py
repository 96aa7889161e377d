"""Figures in a page's prose, filled in from the JSON records as the tables are.

A figure is written ``<!-- fig RECORDS PATH FORMAT -->1.023<!-- /fig -->``: the value
between the comments (what a reader sees; the comments do not render) is regenerated from
the records, so a sentence cannot keep a number its record no longer holds.

- RECORDS: a file under bench/results/ (``overhead_tiny_qwen2_5_vl.json``) or a glob of
  several (``scale_n_*.json``: the values of all of them).
- PATH: keys separated by dots; ``name[k=v,k2=v2]`` keeps the items of the list ``name``
  whose fields match (numbers compare as numbers), and the rest of the path applies to
  each; a list value contributes its items; ``*`` is every value of a mapping. ``A/B``
  divides A's values by B's, item by item (a ratio the record does not store).
- FORMAT: a format spec (``.3f``) for exactly one value, or ``range.3f`` for the least and
  the greatest (``0.959–0.987``; one value when they agree at that precision), ``max.0e``
  or ``min.1f`` for one of them, ``count`` for how many there are, ``mean.3f`` for their
  mean, ``ci95.3f`` for the 95 % interval of that mean (the evaluation's bootstrap,
  ``lad_lab.eval.stats``: the values, e.g. rounds, resampled).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

FIGURE = re.compile(r"<!-- fig (\S+) (\S+) (\S+) -->(.*?)<!-- /fig -->", flags=re.S)
_STEP = re.compile(r"^([\w-]+|\*)(?:\[([^\]]*)\])?$")


class FigureError(ValueError):
    """A figure whose records, path or format do not give a value."""


def _matches(item: Any, conditions: str) -> bool:
    for condition in filter(None, conditions.split(",")):
        key, _, wanted = condition.partition("=")
        value = item.get(key) if isinstance(item, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                if float(wanted) != value:
                    return False
            except ValueError:
                return False
        elif str(value) != wanted:
            return False
    return True


def _flat(items: list[Any]) -> list[Any]:
    return [x for item in items for x in (item if isinstance(item, list) else [item])]


def _walk(values: list[Any], path: str) -> list[Any]:
    for step in path.split("."):
        found = _STEP.match(step)
        if found is None:
            raise FigureError(f"bad path step {step!r}")
        key, conditions = found.groups()
        nxt: list[Any] = []
        for value in values:
            if not isinstance(value, dict) or (key not in value and key != "*"):
                continue
            got = value[key] if key != "*" else _flat(list(value.values()))
            if conditions is not None:
                nxt += [x for x in got if _matches(x, conditions)]
            elif isinstance(got, list):
                nxt += got
            else:
                nxt.append(got)
        values = nxt
    return values


def values(records: list[dict[str, Any]], path: str) -> list[float]:
    """The numbers ``path`` selects in ``records`` (``A/B``: item-by-item ratios)."""
    top, _, bottom = path.partition("/")
    above = _walk(list(records), top)
    if not bottom:
        return [float(v) for v in above if v is not None]
    below = _walk(list(records), bottom)
    if len(above) != len(below):
        raise FigureError(f"{path}: {len(above)} values over {len(below)}")
    return [float(a) / float(b) for a, b in zip(above, below, strict=True)]


def render(numbers: list[float], spec: str) -> str:
    if not numbers:
        raise FigureError("no value")
    for word, pick in (("max", max), ("min", min)):
        if spec.startswith(word):
            return format(pick(numbers), spec.removeprefix(word))
    if spec == "count":
        return str(len(numbers))
    if spec.startswith("mean"):
        return format(sum(numbers) / len(numbers), spec.removeprefix("mean"))
    if spec.startswith("ci95"):
        from lad_lab.eval.stats import bootstrap_indices, mean_ci

        low, high = mean_ci(numbers, bootstrap_indices(len(numbers)))
        number = spec.removeprefix("ci95")
        return f"{format(low, number)}–{format(high, number)}"
    if spec.startswith("range"):
        low, high = (format(x, spec.removeprefix("range")) for x in (min(numbers), max(numbers)))
        return low if low == high else f"{low}–{high}"
    if len(numbers) != 1:
        raise FigureError(f"{len(numbers)} values for one figure (use range{spec})")
    return format(numbers[0], spec)


def load(results: Path, pattern: str) -> list[dict[str, Any]]:
    paths = sorted(results.glob(pattern))
    if not paths:
        raise FigureError(f"no record {pattern} under {results}")
    return [json.loads(p.read_text()) for p in paths]


def fill(text: str, results: Path) -> tuple[str, list[str]]:
    """``text`` with every figure regenerated; the problems of those that could not be."""
    problems: list[str] = []

    def one(found: re.Match[str]) -> str:
        pattern, path, spec, shown = found.groups()
        try:
            value = render(values(load(results, pattern), path), spec)
        except (FigureError, ValueError, TypeError) as exc:
            problems.append(f"figure {pattern} {path} {spec} (now {shown!r}): {exc}")
            return found.group(0)
        return f"<!-- fig {pattern} {path} {spec} -->{value}<!-- /fig -->"

    return FIGURE.sub(one, text), problems


def prose(text: str) -> str:
    """``text`` without its generated parts (blocks between markers, figures, comments)."""
    text = re.sub(r"<!-- bench:([\w-]+):start.*?<!-- bench:\1:end -->", "", text, flags=re.S)
    return re.sub(r"<!--.*?-->", "", FIGURE.sub("", text), flags=re.S)
