"""Transformers' torchvision-only ("fast") image processors, run on torch alone.

About a fifth of the image-text-to-text types (Llama 4, LFM2-VL, Kimi K2.5, Molmo 2 ...)
ship an image processor only as a ``TorchvisionBackend`` class, and torchvision has no
build beside the torch the service pins. Those classes call eight functions of
``torchvision.transforms.v2.functional``; this module implements them on torch tensors
(``torch.nn.functional.interpolate`` for resizing) and imports the class with them in
place. The pixel grid, tiling and so the per-image token counts are the processor's own;
pixel values can differ from torchvision's resampling in the last bits.

:func:`torchvision_only_class` is the one entry point. It installs the stand-in only when
torchvision cannot be imported, and never makes transformers believe torchvision is
installed (``is_torchvision_available`` reads package metadata, which a stand-in lacks),
so every other code path keeps its PIL processors.
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


class InterpolationMode(enum.Enum):
    """torchvision's interpolation names (values as torchvision spells them)."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


_TORCH_MODES = {
    InterpolationMode.NEAREST: "nearest",
    InterpolationMode.NEAREST_EXACT: "nearest-exact",
    InterpolationMode.BILINEAR: "bilinear",
    InterpolationMode.BICUBIC: "bicubic",
    InterpolationMode.BOX: "area",
    InterpolationMode.HAMMING: "bilinear",
    InterpolationMode.LANCZOS: "bicubic",
}


def resize(
    image: torch.Tensor,
    size: Sequence[int],
    interpolation: Any = InterpolationMode.BILINEAR,
    antialias: bool | None = True,
    **_: Any,
) -> torch.Tensor:
    """``image`` (..., C, H, W) resized to ``size`` (H, W)."""
    mode = _TORCH_MODES.get(interpolation, "bilinear")
    if isinstance(interpolation, int):  # a PIL resampling code
        mode = {0: "nearest", 2: "bilinear", 3: "bicubic", 4: "area"}.get(interpolation, "bicubic")
    lead, (height, width) = image.shape[:-3], image.shape[-2:]
    if len(size) == 1:  # the shorter edge to size[0], aspect kept
        short = size[0]
        size = (
            (short, round(width * short / height))
            if height <= width
            else (round(height * short / width), short)
        )
    dtype = image.dtype
    flat = image.reshape(-1, *image.shape[-3:]).to(torch.float32)
    smooth = bool(antialias) and mode in ("bilinear", "bicubic")
    out = F.interpolate(
        flat,
        size=(int(size[0]), int(size[1])),
        mode=mode,
        antialias=smooth,
        **({"align_corners": False} if mode in ("bilinear", "bicubic") else {}),
    )
    if not dtype.is_floating_point:
        out = out.round().clamp(0, 255)
    return out.to(dtype).reshape(*lead, *out.shape[-3:])


def pad(
    image: torch.Tensor,
    padding: Sequence[int] | int,
    fill: float | Sequence[float] | None = 0,
    padding_mode: str = "constant",
) -> torch.Tensor:
    """torchvision's padding: [all], [left/right, top/bottom] or [left, top, right, bottom]."""
    values = [padding] if isinstance(padding, int) else list(padding)
    if len(values) == 1:
        values = values * 4
    elif len(values) == 2:
        values = [values[0], values[1], values[0], values[1]]
    left, top, right, bottom = (int(v) for v in values)
    mode = {"edge": "replicate", "symmetric": "reflect"}.get(padding_mode, padding_mode)
    if mode != "constant":
        return F.pad(image.to(torch.float32), (left, right, top, bottom), mode=mode).to(image.dtype)
    value = fill if isinstance(fill, (int, float)) else (fill[0] if fill else 0)
    return F.pad(image, (left, right, top, bottom), mode="constant", value=float(value or 0))


def crop(image: torch.Tensor, top: int, left: int, height: int, width: int) -> torch.Tensor:
    """The (height, width) window at (top, left), zero beyond the image (as torchvision)."""
    below, right = top + height - image.shape[-2], left + width - image.shape[-1]
    if top < 0 or left < 0 or below > 0 or right > 0:
        image = pad(image, [max(-left, 0), max(-top, 0), max(right, 0), max(below, 0)])
        top, left = max(top, 0), max(left, 0)
    return image[..., top : top + height, left : left + width]


def normalize(
    image: torch.Tensor, mean: Sequence[float], std: Sequence[float], inplace: bool = False
) -> torch.Tensor:
    """(image - mean) / std per channel."""
    shape = (-1, 1, 1)
    mean_t = torch.as_tensor(mean, dtype=image.dtype, device=image.device).view(shape)
    std_t = torch.as_tensor(std, dtype=image.dtype, device=image.device).view(shape)
    return image.sub_(mean_t).div_(std_t) if inplace else (image - mean_t) / std_t


def to_dtype(image: torch.Tensor, dtype: torch.dtype, scale: bool = False) -> torch.Tensor:
    """``image`` as ``dtype``; with ``scale``, uint8 [0, 255] <-> float [0, 1]."""
    if not scale or image.dtype.is_floating_point == dtype.is_floating_point:
        return image.to(dtype)
    if dtype.is_floating_point:
        return image.to(dtype) / 255.0
    return (image * 255.0).round().clamp(0, 255).to(dtype)


def grayscale_to_rgb(image: torch.Tensor) -> torch.Tensor:
    """One channel repeated three times (a 3-channel image unchanged)."""
    return image if image.shape[-3] == 3 else image.expand(*image.shape[:-3], 3, *image.shape[-2:])


def pil_to_tensor(image: Any) -> torch.Tensor:
    """A PIL image as a (C, H, W) uint8 tensor."""
    array = np.array(image, copy=True)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def center_crop(image: torch.Tensor, output_size: Sequence[int] | int) -> torch.Tensor:
    """The centred window of ``output_size``."""
    height, width = (output_size, output_size) if isinstance(output_size, int) else output_size
    top = round((image.shape[-2] - height) / 2.0)
    left = round((image.shape[-1] - width) / 2.0)
    return crop(image, top, left, int(height), int(width))


_FUNCTIONS = (
    resize,
    pad,
    crop,
    center_crop,
    normalize,
    to_dtype,
    grayscale_to_rgb,
    pil_to_tensor,
)


def _has_real_torchvision() -> bool:
    module = sys.modules.get("torchvision")
    if module is not None:
        return not getattr(module, "__lad_stand_in__", False)
    return importlib.util.find_spec("torchvision") is not None


def _install() -> None:
    """The stand-in's modules in ``sys.modules`` and in transformers' image modules."""
    if "torchvision" in sys.modules:
        return
    functional = types.ModuleType("torchvision.transforms.v2.functional")
    for function in _FUNCTIONS:
        setattr(functional, function.__name__, function)
    functional.InterpolationMode = InterpolationMode
    names = ("torchvision", "torchvision.transforms", "torchvision.transforms.v2")
    modules = {name: types.ModuleType(name) for name in names}
    modules["torchvision"].__lad_stand_in__ = True
    modules["torchvision.transforms"].InterpolationMode = InterpolationMode
    modules["torchvision.transforms"].functional = functional
    modules["torchvision.transforms"].v2 = modules["torchvision.transforms.v2"]
    modules["torchvision.transforms.v2"].functional = functional
    modules["torchvision"].transforms = modules["torchvision.transforms"]
    sys.modules.update(modules)
    sys.modules["torchvision.transforms.v2.functional"] = functional
    sys.modules["torchvision.transforms.functional"] = functional
    from transformers import image_processing_backends, image_processing_utils, image_utils

    for module in (image_processing_backends, image_processing_utils):
        if not hasattr(module, "tvF"):
            module.tvF = functional
    if not image_utils.pil_torch_interpolation_mapping:
        resampling = image_utils.PILImageResampling
        mapping = {
            resampling.NEAREST: InterpolationMode.NEAREST_EXACT,
            resampling.BOX: InterpolationMode.BOX,
            resampling.BILINEAR: InterpolationMode.BILINEAR,
            resampling.HAMMING: InterpolationMode.HAMMING,
            resampling.BICUBIC: InterpolationMode.BICUBIC,
            resampling.LANCZOS: InterpolationMode.LANCZOS,
        }
        image_utils.pil_torch_interpolation_mapping.update(mapping)
        image_utils.torch_pil_interpolation_mapping.update({v: k for k, v in mapping.items()})
    for name in ("image_processing_backends",):
        module = sys.modules[f"transformers.{name}"]
        module.pil_torch_interpolation_mapping = image_utils.pil_torch_interpolation_mapping
        module.torch_pil_interpolation_mapping = image_utils.torch_pil_interpolation_mapping


def torchvision_only_class(name: str) -> type | None:
    """transformers' image processor class ``name`` that needs torchvision, importable here
    (the stand-in installed where torchvision is absent); None where no model module of
    transformers defines it."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    for model_type, names in IMAGE_PROCESSOR_MAPPING_NAMES.items():
        if not isinstance(names, dict) or names.get("torchvision") != name:
            continue
        if not _has_real_torchvision():
            _install()
        module_name = model_type_to_module_name(model_type)
        module = importlib.import_module(
            f"transformers.models.{module_name}.image_processing_{module_name}"
        )
        return getattr(module, name, None)
    return None


def load_image_processor(path: str, **options: Any) -> Any:
    """The saved image processor: ``AutoImageProcessor``'s, or where the class it names
    needs torchvision and none is installed, that class on the stand-in."""
    from transformers import AutoImageProcessor
    from transformers.image_processing_base import ImageProcessingMixin

    try:
        return AutoImageProcessor.from_pretrained(path, **options)
    except ValueError:
        saved, _ = ImageProcessingMixin.get_image_processor_dict(path, **options)
        cls = torchvision_only_class(str(saved.get("image_processor_type")))
        if cls is None:
            raise
    return cls.from_pretrained(path, **options)
