"""The torch stand-in for the torchvision functions transformers' fast image processors call."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from app.models import torchvision_stand_in as tv


def _image(height: int = 37, width: int = 53, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, 256, (3, height, width), dtype=np.uint8))


def test_resize_matches_pil_bilinear_to_a_grey_level() -> None:
    image = _image()
    ours = tv.resize(image, [24, 30], interpolation=tv.InterpolationMode.BILINEAR)
    pil = Image.fromarray(image.permute(1, 2, 0).numpy()).resize((30, 24), Image.BILINEAR)
    theirs = torch.from_numpy(np.array(pil)).permute(2, 0, 1)
    assert ours.shape == (3, 24, 30) and ours.dtype == torch.uint8
    assert (ours.float() - theirs.float()).abs().mean() < 2.0


def test_resize_keeps_leading_dims_and_the_short_edge_form() -> None:
    batch = torch.stack([_image(seed=1), _image(seed=2)]).float()
    assert tv.resize(batch, [10, 12]).shape == (2, 3, 10, 12)
    assert tv.resize(_image(20, 40), [10]).shape == (3, 10, 20)


def test_pad_crop_and_normalize_follow_torchvision() -> None:
    image = torch.ones(3, 2, 3)
    padded = tv.pad(image, [1, 2, 3, 4], fill=0)  # left, top, right, bottom
    assert padded.shape == (3, 2 + 2 + 4, 3 + 1 + 3)
    assert padded[:, 2:4, 1:4].eq(1).all() and padded.sum() == image.sum()
    assert tv.crop(image, 1, 1, 3, 3).shape == (3, 3, 3)  # zero beyond the image
    assert tv.crop(image, 1, 1, 3, 3).sum() == 3 * 1 * 2
    out = tv.normalize(torch.full((3, 1, 1), 0.5), [0.5, 0.25, 0.0], [0.5, 0.25, 0.5])
    assert out.flatten().tolist() == [0.0, 1.0, 1.0]
    assert tv.to_dtype(torch.tensor([255], dtype=torch.uint8), torch.float32, scale=True) == 1.0


def test_a_torchvision_only_processor_runs_and_reloads(tmp_path) -> None:
    from transformers.utils.import_utils import is_torchvision_available

    cls = tv.torchvision_only_class("Lfm2VlImageProcessor")  # LFM2-VL ships no PIL class
    assert cls is not None
    processor = cls()
    image = Image.fromarray(_image(300, 200).permute(1, 2, 0).numpy())
    first = processor(images=[image], return_tensors="pt")
    processor.save_pretrained(tmp_path)
    again = tv.load_image_processor(str(tmp_path))(images=[image], return_tensors="pt")
    assert type(tv.load_image_processor(str(tmp_path))) is cls
    assert torch.equal(first["pixel_values"], again["pixel_values"])
    assert is_torchvision_available() == tv._has_real_torchvision()  # nothing pretends
