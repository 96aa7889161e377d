"""The demo model's processor, built entirely in code (nothing is downloaded).

A word-level tokenizer over a closed vocabulary (the synthetic world's words, the
paper's prompt words, label words, digits 1..12 and Qwen's special tokens) keeps
sequences short, so the demo model trains on a laptop CPU in under an hour. The
image processor is the real ``Qwen2VLImageProcessorPil`` with ``min_pixels`` and
``max_pixels`` pinned so that every image becomes IMAGE_SIZE x IMAGE_SIZE pixels,
i.e. (IMAGE_SIZE/14)^2 patches and (IMAGE_SIZE/28)^2 tokens after the 2x2 merge.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from app.models.qwen2_vl import Qwen2_5_VLProcessorNoVideo
from lad_lab.demo.world import DEFAULT_IMAGE_SIZE

IMAGE_SIZE = DEFAULT_IMAGE_SIZE  # 56 px per side: 4x4 patches of 14 px -> 2x2 = 4 tokens

SPECIAL_TOKENS: tuple[str, ...] = (
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
    "<unk>",
)

# Words of the prompts in DESIGN §2.6 (vanilla, instruction, CoT) and of the chat template.
PROMPT_TEXT = (
    "system user assistant You are a helpful assistant . "
    "Given images indexed from to , identify the image that best matches the provided "
    "caption . Respond with the index number only and nothing else . Caption : Answer : "
    "Please note that the provided images have been randomly shuffled , so it is essential to "
    "consider them fairly and without bias . Analyze the visual content objectively and do not "
    "be influenced by the order of the images . label labels Think step by step first then "
    "give your final answer as The answer is reasoning Let us think about each image "
    "describe compare describes shows contains a an in on at with of ' \" ! ? ; - ( ) [ ] / "
)
LABEL_WORDS: tuple[str, ...] = (
    *[str(i) for i in range(0, 13)],
    *"ABCDEFGHIJKL",
    *"abcdefghijkl",
    "I",
    "II",
    "III",
    "IV",
    "V",
    "VI",
    "VII",
    "VIII",
    "IX",
    "X",
    "XI",
    "XII",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
)
# A broad attribute vocabulary, so a caption from the synthetic world never falls on <unk>.
WORLD_FALLBACK_TEXT = (
    "red green blue yellow orange purple pink brown black white gray grey cyan magenta "
    "circle square triangle star diamond cross hexagon ellipse rectangle heart ring "
    "small medium large big tiny huge left right top bottom center centre middle upper lower "
    "corner plain striped dotted checkered light dark background textured solid "
    "object shape picture photo of on the and two"
)

# Words added after v1 of the demo model, appended *after* every other word so that the
# ids of v1's vocabulary stay put (v2 was fine-tuned from v1 with one embedding row added).
LATE_WORDS = "labeled"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_WORD = re.compile(r"\w+|[^\w\s]")


def split_words(text: str) -> list[str]:
    """Split text the way the tokenizer's pre-tokenizer does (words and single punctuation)."""
    return _WORD.findall(text)


def build_vocabulary(extra_texts: Iterable[str] = ()) -> list[str]:
    """Ordered, de-duplicated vocabulary: special tokens first, then every word seen."""
    vocab: list[str] = list(SPECIAL_TOKENS)
    seen = set(vocab)
    texts = [PROMPT_TEXT, " ".join(LABEL_WORDS), WORLD_FALLBACK_TEXT, *extra_texts, LATE_WORDS]
    for text in texts:
        for word in split_words(text):
            for w in (word, word.lower(), word.capitalize()):
                if w not in seen:
                    seen.add(w)
                    vocab.append(w)
    return vocab


def build_tokenizer(extra_texts: Iterable[str] = ()) -> TokenizersBackend:
    """A word-level fast tokenizer with Qwen's special tokens, wrapped for transformers."""
    vocab = {w: i for i, w in enumerate(build_vocabulary(extra_texts))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation("isolated")]
    )
    tokenizer = TokenizersBackend(
        tokenizer_object=core,
        unk_token="<unk>",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<unk>",)],
        model_max_length=4096,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_image_processor(image_size: int = IMAGE_SIZE) -> Qwen2VLImageProcessorPil:
    """The real Qwen2-VL image processor, pinned to image_size x image_size pixels."""
    pixels = image_size * image_size
    return Qwen2VLImageProcessorPil(min_pixels=pixels, max_pixels=pixels)


def build_processor(
    extra_texts: Iterable[str] = (), image_size: int = IMAGE_SIZE
) -> Qwen2_5_VLProcessorNoVideo:
    """Build the demo processor: pinned image processor + word-level tokenizer + chat template."""
    return Qwen2_5_VLProcessorNoVideo(
        image_processor=build_image_processor(image_size),
        tokenizer=build_tokenizer(extra_texts),
        chat_template=CHAT_TEMPLATE,
    )


def load_processor(path: str | Path) -> Qwen2_5_VLProcessorNoVideo:
    """Load the saved demo processor from a local directory, offline."""
    return Qwen2_5_VLProcessorNoVideo.from_pretrained(str(path), local_files_only=True)
