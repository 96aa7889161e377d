"""The tiny tokenizer's special tokens, and the config's token ids pointed at them.

A checkpoint's vocabulary holds every special token its processor, its adapter and its
config name; the tiny byte-level one is given the same (those the processor reads, those its
image expansion writes, those it asks for when called), and the config's ``<x>_token_id``
fields then name the tiny vocabulary's ids, as a checkpoint's config names its own.
"""

from __future__ import annotations

import inspect
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from transformers import PretrainedConfig

from app.models.registry import adapter_class, registered
from lad_lab.testing.generic.shrink import config_tree
from lad_lab.testing.tiny_base import byte_level_tokenizer, random_images

TOKEN_ID = re.compile(r"_token_(id|index)$|^(bos|eos|pad)_token_id$")
"""A config field holding a token's id (``image_token_id``, ``bos_token_id`` ...)."""


def token_text(name: str) -> str:
    """The text of the special token for a tokenizer attribute (``image_token``: ``<|image|>``)."""
    return f"<|{name.removesuffix('_token')}|>"


def adapter_tokens(model_type: str) -> dict[str, str]:
    """Tokens the adapter registered for the type reads by name (its end of turn, its image
    delimiters): a checkpoint's vocabulary has them, so the tiny one does too."""
    if not registered(model_type):
        return {}
    adapter = adapter_class(model_type)
    texts = [adapter.end_token, *(adapter.image_delimiters or ())]
    return {f"lad_adapter_{i}": t for i, t in enumerate(texts) if t}


_ASKED = re.compile(r"tokenizer does not have an? `(\w+?)(_id)?` defined")


def asked_on_a_call(processor: Any, named: dict[str, str]) -> dict[str, str]:
    """A tokenizer attribute the processor asks for only when called (one probe call)."""
    try:
        processor(text=[placeholder_of(processor)], images=[probe_image()])
    except Exception as exc:  # the probe is only to read what the processor asks for
        missing = _ASKED.search(str(exc))
        if missing is not None and missing.group(1) not in named:
            return {missing.group(1): token_text(missing.group(1))}
    return {}


_TOKEN_LIKE = re.compile(r"<\|?[A-Za-z_][\w.:/-]*\|?>|\[[A-Z][A-Z_]*\]")


def unwritten_tokens(processor: Any, named: dict[str, str]) -> dict[str, str]:
    """Special tokens the processor's image expansion writes as literal text (``<IMG_START>``,
    ``<low_res_im_start>``) that the tokenizer spells byte by byte: a checkpoint's vocabulary
    has each as one token, so the tiny one gets them too."""
    tokenizer = processor.tokenizer
    ids = probe_ids(processor, placeholder_of(processor))
    vocab = tokenizer.get_vocab()
    found = dict.fromkeys(_TOKEN_LIKE.findall(tokenizer.decode(ids)))
    taken = set(named.values())
    fresh = [t for t in found if t not in vocab and t not in taken]
    return {f"lad_expansion_{len(named) + i}": t for i, t in enumerate(fresh)}


def absent_tokens(processor: Any, tokenizer: Any, named: dict[str, str]) -> dict[str, str]:
    """Token strings the processor holds that the tokenizer cannot write as one token."""
    absent: dict[str, str] = {}
    vocab = tokenizer.get_vocab()
    for key, value in vars(processor).items():
        if not key.endswith("_token"):
            continue
        if isinstance(value, str) and value and value not in vocab:
            absent[f"lad_{key}" if key in named else key] = value
        elif value is None and key not in named:  # read from a tokenizer attribute it lacks
            absent[key] = token_text(key)
    return absent


_CHAT_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def config_token_stems(config: PretrainedConfig) -> list[str]:
    """``vision_start_token`` for a config field ``vision_start_token_id`` ... (bos, eos and
    pad left out: the tokenizer has its own)."""
    stems = []
    for sub in config_tree(config):
        for key in vars(sub):
            if TOKEN_ID.search(key) and not key.startswith(("bos_", "eos_", "pad_")):
                stems.append(re.sub(r"_(id|index)$", "", key))
    return list(dict.fromkeys(stems))


def build_tokenizer(processor_cls: type, named: dict[str, str], stems: Sequence[str] = ()) -> Any:
    """Byte-level BPE with the chat tokens, the processor's default token strings (its
    ``__init__`` defaults and class attributes) and the ``named`` tokenizer attributes."""
    texts: list[str] = list(_CHAT_TOKENS)
    for param in inspect.signature(processor_cls.__init__).parameters.values():
        if param.name.endswith("_token") and isinstance(param.default, str):
            texts.append(param.default)
    for key, value in vars(processor_cls).items():
        if key.endswith("_token") and isinstance(value, str):
            texts.append(value)
    texts.extend(named.values())
    texts.extend(token_text(stem) for stem in stems)
    unique = list(dict.fromkeys(t for t in texts if t and t not in _CHAT_TOKENS))
    attributes = {k: v for k, v in named.items() if not k.startswith("lad_")}
    tokenizer = byte_level_tokenizer(unique, attributes)
    if tokenizer.bos_token is None:  # processors that write it into the prompt (PaliGemma)
        tokenizer.bos_token = "<|endoftext|>"
    # saved as the bool it is: a type whose checkpoints transformers loads with another
    # byte-level class (GPT2Tokenizer for HyperCLOVAX) refuses a saved None
    tokenizer.add_prefix_space = bool(tokenizer.add_prefix_space)
    return tokenizer


def probe_ids(processor: Any, text: str) -> list[int]:
    """Token ids the processor makes of ``text`` with one small image (empty if it fails)."""
    try:
        out = processor(text=[text], images=[probe_image()], return_tensors="pt")
    except Exception:  # a processor that cannot take this probe: nothing learnt
        return []
    return out["input_ids"][0].tolist()


def placeholder_of(processor: Any) -> str:
    """What a prompt writes for an image: the processor's ``image_placeholder_token`` where
    it has one (it expands that into its ``image_token``s), else its image token."""
    for key in ("image_placeholder_token", "image_placeholder", "image_token"):
        value = getattr(processor, key, None)
        if isinstance(value, str) and value:
            return value
    return "<image>"


def probe_image() -> Any:
    """The one small image the probes send."""
    return random_images(1, seed=99, sizes=[(48, 48)])[0]


def image_token_from_expansion(config: PretrainedConfig, processor: Any) -> None:
    """Where the processor's expansion of an image leaves out the token the config names as
    the image token (the placeholder ``<image>`` becomes ``<IMG_ATOM>`` x 256), point the
    config at the token the expansion repeats most: the one the image's features replace."""
    placeholder = placeholder_of(processor)
    ids = probe_ids(processor, placeholder)
    plain = set(probe_ids(processor, ""))  # the tokens a prompt has without an image
    counted = Counter(i for i in ids if i not in plain)
    if not counted:
        return
    for owner in (config, getattr(config, "text_config", None)):
        for key in ("image_token_id", "image_token_index"):
            value = getattr(owner, key, None) if owner is not None else None
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            if value not in ids or _only_opens(value, counted):
                setattr(owner, key, counted.most_common(1)[0][0])


def _only_opens(token: int, counted: Counter) -> bool:
    """Whether ``token`` is written once in an image's expansion that repeats another token
    (Llama 4's ``<|image|>`` opening 256 ``<|patch|>``): the repeated one takes the features."""
    return counted.get(token) == 1 and counted.most_common(1)[0][1] > 1


def set_token_ids(config: PretrainedConfig, processor: Any) -> None:
    """Point the config's token ids at the tokenizer's: ``image_token_id`` at the processor's
    image token, ``<x>_token_id`` at the processor's ``<x>_token`` where it has one, and any
    other id outside the small vocabulary at the padding token."""
    tokenizer = processor.tokenizer
    size = len(tokenizer)
    pad = tokenizer.pad_token_id
    for sub in config_tree(config):
        for key, value in list(vars(sub).items()):
            if not TOKEN_ID.search(key) or isinstance(value, bool):
                continue
            stem = re.sub(r"_(id|index)$", "", key)
            text = getattr(processor, stem, None)
            if stem == "image_token" and text is None:
                text = getattr(processor, "image_token", None)
            if not isinstance(text, str) or text not in tokenizer.get_vocab():
                text = token_text(stem)
            if key.startswith(("bos_", "eos_", "pad_")):
                own = getattr(tokenizer, key)
                setattr(sub, key, own if own is not None else pad)
            elif text in tokenizer.get_vocab():
                setattr(sub, key, tokenizer.convert_tokens_to_ids(text))
            elif isinstance(value, int) and value >= size:
                setattr(sub, key, pad)
            elif isinstance(value, list):
                setattr(sub, key, [v if v < size else pad for v in value])
    if getattr(config, "image_token_index", None) is not None and hasattr(config, "image_token_id"):
        config.image_token_index = config.image_token_id
