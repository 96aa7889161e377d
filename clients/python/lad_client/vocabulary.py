"""The wire vocabulary: the names and bounds a request may use, defined once.

The lowest layer of the project: the service's engine (label schemes, methods), its settings
(MAX_N) and the profile store (profile names) import these, so a client and the server it
talks to agree on them without the client importing the server. Standard library only.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

SCHEMES: Final[tuple[str, ...]] = ("digits", "upper", "lower", "roman", "words")
"""The label schemes by name (DESIGN §2.1): "1".."N", "A".., "a".., roman numerals, words."""

Method = Literal["agd", "vanilla", "pride", "attn_raw", "attn_pure", "perm_avg"]
METHODS: Final[tuple[str, ...]] = get_args(Method)
"""agd (the default) first; perm_avg costs N forward passes, every other method one."""

MAX_N: Final[int] = 64
"""The largest N any setting or route accepts (LAD_MAX_IMAGES is at most this)."""

NAME_PATTERN: Final[str] = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""What a calibration profile name may be (names travel in URLs, /v1/profiles/{name}, and
in store keys)."""

IGNORED_RERANK_FIELDS: Final[tuple[str, ...]] = (
    "max_tokens_per_doc",
    "max_chunks_per_doc",
    "rank_fields",
    "raw_scores",
    "truncate_prompt_tokens",
    "truncate",
    "truncation_direction",
    "return_text",
    "return_embeddings",
    "instruction",
    "priority",
    "use_activation",
    "softmax",
    "activation",
    "mm_processor_kwargs",
    "user",
)
"""Fields that other rerank APIs' clients send (Cohere v1 and v2, Jina, vLLM, Infinity, TEI)
and that change nothing for an image ranking: accepted on the rerank routes, ignored, and
counted by name (``lad_rerank_ignored_fields_total``; any other unknown field is counted
as "other", so a client cannot add a label value per request)."""
