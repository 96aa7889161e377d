"""Rope sections that agree with the rotary width, for a tiny build of a default config.

A multi-axis rope splits the rotary frequencies into sections (``mrope_section``: temporal,
height, width). Some default configs leave the sections to the model code and lay out a
head dimension whose full rotary width does not match them (a checkpoint saves a
``partial_rotary_factor`` with it, e.g. half of a 128-wide head for sections of 8 + 12 + 12);
read from the built rotary modules themselves, the factor that makes them agree.
"""

from __future__ import annotations

import torch


def partial_rotary_for_sections(model: torch.nn.Module) -> bool:
    """Where a rotary module's sections cover fewer frequencies than it has, set the text
    config's ``partial_rotary_factor`` so they cover all (True: rebuild the model)."""
    changed = False
    for module in model.modules():
        sections = getattr(module, "mrope_section", None)
        inv_freq = getattr(module, "inv_freq", None)
        config = getattr(module, "config", None)
        if not (isinstance(sections, (list, tuple)) and isinstance(inv_freq, torch.Tensor)):
            continue
        wanted, have = int(sum(sections)), int(inv_freq.shape[-1])
        rope = getattr(config, "rope_parameters", None)
        if wanted >= have or not isinstance(rope, dict) or "partial_rotary_factor" in rope:
            continue
        rope["partial_rotary_factor"] = wanted / have
        changed = True
    return changed
