"""The decode stage: wire input to engine input, within the operator's limits, before the
queue. ``decoder`` holds the checks of the text (query, labels, label text) and the image
decoding; ``headers`` what an image's header may cost and the format it names."""

from app.service.decode.decoder import (
    TRIM_AFTER_BYTES,
    Decoder,
    ImageInput,
    parse_label_text,
    target_size,
)
from app.service.decode.headers import check_header, sniff_format

__all__ = [
    "TRIM_AFTER_BYTES",
    "Decoder",
    "ImageInput",
    "check_header",
    "parse_label_text",
    "sniff_format",
    "target_size",
]
