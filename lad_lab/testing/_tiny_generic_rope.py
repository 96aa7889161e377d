"""Rope sections that agree with the rotary width, for a tiny build of a default config.

A multi-axis rope splits the rotary frequencies into sections (``mrope_section``: temporal,
height, width). Some default configs leave the sections to the model code and lay out a
head dimension whose rotary width does not match them (a checkpoint saves the two agreeing:
a ``partial_rotary_factor`` of half a 128-wide head for sections of 8 + 12 + 12). Read from
the built rotary modules themselves: where the sections cover fewer frequencies than the
rotary width has, the factor that narrows it to them; where more (the tiny head is narrower
than the checkpoint's), the sections scaled down to the width in the same proportions.
"""

from __future__ import annotations

import torch


def rope_sections_agreed(model: torch.nn.Module) -> bool:
    """Make every rotary module's sections cover its frequencies exactly, in its config's
    ``rope_parameters`` (True: something changed, rebuild the model)."""
    changed = False
    for module in model.modules():
        sections = getattr(module, "mrope_section", None)
        inv_freq = getattr(module, "inv_freq", None)
        rope = getattr(getattr(module, "config", None), "rope_parameters", None)
        if not (isinstance(sections, (list, tuple)) and isinstance(inv_freq, torch.Tensor)):
            continue
        wanted, have = int(sum(sections)), int(inv_freq.shape[-1])
        if wanted == have or not isinstance(rope, dict):
            continue
        if wanted < have and "partial_rotary_factor" not in rope:
            rope["partial_rotary_factor"] = wanted / have
        elif wanted > have >= len(sections):
            rope["mrope_section"] = scaled_sections(list(sections), have)
        else:
            continue
        changed = True
    return changed


def scaled_sections(sections: list[int], total: int) -> list[int]:
    """``sections`` in the same proportions, summing to ``total`` (each at least 1)."""
    scaled = [max(1, s * total // sum(sections)) for s in sections]
    scaled[0] += total - sum(scaled)
    return scaled
