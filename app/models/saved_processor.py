"""A saved processor that ``AutoProcessor`` cannot build here, rebuilt from its parts.

Many processors of the mapping carry a video processor, and every video processor of
transformers needs torchvision, which the service does not install; no video is ever sent.
Such a checkpoint's processor is rebuilt as the class it names (``processor_class``) from
its saved tokenizer and image processor, with a plain ``BaseVideoProcessor`` standing in
for the video side. The tiny builds (``lad_lab.testing``) make their processors the same way.
"""

from __future__ import annotations

import inspect
from typing import Any

from app.models.base import HFAdapter


def load_saved_processor(path: str, revision: str | None, trust_remote_code: bool) -> Any:
    """The processor class the checkpoint at ``path`` names, built from its saved parts
    (tokenizer, image processor, an audio feature extractor where it has one), with a
    stand-in video processor."""
    from transformers import AutoTokenizer
    from transformers.processing_utils import ProcessorMixin

    from app.models.torchvision_stand_in import load_image_processor

    saved, _ = ProcessorMixin.get_processor_dict(path, revision=revision)
    processor_cls = processor_class_named(str(saved.get("processor_class")))
    options = {"revision": revision, "trust_remote_code": trust_remote_code}
    parts: dict[str, Any] = {
        "tokenizer": AutoTokenizer.from_pretrained(path, **options),
        "image_processor": load_image_processor(path, **options),
    }
    attributes = processor_cls.get_attributes()
    if "video_processor" in attributes:
        processor_cls = with_stand_in_video(processor_cls)
        parts["video_processor"] = stand_in_video_processor(parts["image_processor"])
    if "feature_extractor" in attributes:  # an audio front end (omni models)
        from transformers import AutoFeatureExtractor

        parts["feature_extractor"] = AutoFeatureExtractor.from_pretrained(path, **options)
    params = inspect.signature(processor_cls.__init__).parameters
    settings = {
        k: v for k, v in saved.items() if k in params and k not in parts and k not in attributes
    }
    settings["chat_template"] = parts["tokenizer"].chat_template or saved.get("chat_template")
    return processor_cls(**parts, **settings)


_STAND_INS: dict[type, type] = {}


def with_stand_in_video(processor_cls: type) -> type:
    """``processor_cls`` taking a plain ``BaseVideoProcessor`` as its video processor.

    The family's video processors need torchvision, which the service does not install, and
    no video is ever sent; the processor's own code (positional parts, its image and text
    expansion) runs unchanged. Same class name, so a saved processor names its family's
    class."""
    if processor_cls not in _STAND_INS:

        def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
            from transformers.video_processing_utils import BaseVideoProcessor

            if argument_name == "video_processor" and isinstance(argument, BaseVideoProcessor):
                return BaseVideoProcessor
            return processor_cls.check_argument_for_proper_class(self, argument_name, argument)

        namespace = {
            "check_argument_for_proper_class": check_argument_for_proper_class,
            "__module__": processor_cls.__module__,
            "__doc__": f"{processor_cls.__name__} with a stand-in video processor.",
        }
        _STAND_INS[processor_cls] = type(processor_cls.__name__, (processor_cls,), namespace)
    return _STAND_INS[processor_cls]


def stand_in_video_processor(image_processor: Any) -> Any:
    """A plain ``BaseVideoProcessor`` carrying the image processor's settings: a processor
    that reads its video processor's settings when built (MiniCPM-V's ``slice_mode``)
    finds the image side's, and no video is ever sent."""
    from transformers.video_processing_utils import BaseVideoProcessor

    video = BaseVideoProcessor()
    for key, value in vars(image_processor).items():
        if not key.startswith("_") and not hasattr(video, key):
            setattr(video, key, value)
    return video


def _adapter_classes(root: type) -> list[type]:
    """Every adapter class defined so far (the registry imports the families' modules)."""
    found = []
    for sub in root.__subclasses__():
        found.extend([sub, *_adapter_classes(sub)])
    return found


def processor_class_named(name: str) -> type:
    """The processor class a checkpoint names (a tiny build's ``...NoVideo`` subclass by its
    parent's name), torchvision-free where a family adapter has its own build of it (its
    ``processor_class``; the registry has imported the families before any load)."""
    import transformers

    name = name.removesuffix("NoVideo")
    for adapter in _adapter_classes(HFAdapter):  # e.g. Mistral 3's PixtralProcessor
        own = adapter.processor_class
        if own is not None and own.__name__ == name:
            return own
    processor_cls = getattr(transformers, name, None)
    if processor_cls is None or not hasattr(processor_cls, "get_attributes"):
        raise ValueError(f"the checkpoint names no processor class transformers has ({name!r})")
    return processor_cls
