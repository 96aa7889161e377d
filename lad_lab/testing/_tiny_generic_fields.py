"""Config fields a model's code reads that its default config does not define.

Some configs leave a field to the checkpoint's ``config.json`` (an omni thinker's
``vision_start_token_id``: its rope index finds each image by the token before it, and
the thinker's config class declares no such field). The tiny build reads which delimiter
ids the model's own module asks its config for and gives the config each one (the id is
set later, with the others, to the tiny tokenizer's token of that name), an image's
opening delimiter with its closing one.
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any

from transformers import PretrainedConfig

_READ_DELIMITER = re.compile(r"config\.((?:image|vision)_(start|end)_token_id)\b")


def delimiters_the_code_reads(model_cls: type) -> list[str]:
    """``vision_start_token_id`` ... fields the model's module reads off a config, each
    opening delimiter with its closing one."""
    try:
        source = inspect.getsource(sys.modules[model_cls.__module__])
    except (OSError, TypeError, KeyError):  # no source to read: nothing learnt
        return []
    names = [m.group(1) for m in _READ_DELIMITER.finditer(source)]
    paired = [n.replace("_start_", "_end_") if "_start_" in n else n for n in names]
    return list(dict.fromkeys(names + paired))


def add_read_delimiters(config: Any, model_cls: type) -> None:
    """The delimiter fields the model reads and neither ``config`` nor its text config
    defines, added to ``config`` (unset: the tokenizer's ids are given later)."""
    text = getattr(config, "text_config", None)
    for name in delimiters_the_code_reads(model_cls):
        if not any(name in vars(owner) for owner in (config, text) if owner is not None):
            setattr(config, name, None)


def config_tree(config: PretrainedConfig) -> list[PretrainedConfig]:
    """``config`` and every sub-config under it, depth first (what the shrink walks)."""
    found = [config]
    for value in vars(config).values():
        if isinstance(value, PretrainedConfig):
            found.extend(config_tree(value))
    return found
