"""The encoder cache's LRU, keys and splits on plain tensors; its setting and its metrics.

The model-level exactness (cache on == cache off for every family that uses it) is in
tests/integration/models/test_encoder_cache.py."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from pydantic import ValidationError
from transformers.modeling_outputs import BaseModelOutputWithPooling

from app.engine.encoder_cache import MB, EncoderCache
from app.engine.encoder_split import FirstDim, GridRows, Layout, Tiles, assembled, unit_features
from app.engine.image_identity import content_id, preprocessing_fingerprint
from app.observability.metrics import Metrics
from app.settings import Settings


def _features(rows: int, value: float = 1.0) -> tuple[torch.Tensor, ...]:
    return (torch.full((rows, 256), float(value)),)  # rows x 1 KiB of float32


def test_the_lru_keeps_the_most_recently_used_within_its_bound() -> None:
    cache = EncoderCache(4 / 1024)  # 4 KiB: four one-row entries
    for k in range(4):
        cache.put(bytes([k]), _features(1, k))
    assert cache.bytes == 4096 and len(cache) == 4
    assert cache.get(bytes([0])) is not None  # 0 is now the most recently used
    cache.put(b"\x09", _features(1, 9))
    assert cache.get(bytes([1])) is None and cache.get(bytes([0])) is not None
    assert cache.stats.evictions == 1 and cache.bytes == 4096
    cache.put(b"\x0a", _features(2))  # two rows: two more evictions
    assert cache.stats.evictions == 3 and cache.bytes == 4096
    cache.put(b"\x0b", _features(5))  # larger than the whole bound: not kept, nothing evicted
    assert cache.get(b"\x0b") is None and cache.stats.evictions == 3 and len(cache) == 3


def test_a_kept_entry_is_a_copy_not_a_view_of_its_batch() -> None:
    cache = EncoderCache(1)
    batch = torch.zeros(8, 256)
    cache.put(b"k", (batch[:1],))
    batch.fill_(5.0)
    (kept,) = cache.get(b"k") or ()
    assert kept.untyped_storage().nbytes() == 1024 and float(kept.sum()) == 0.0


def test_the_key_reads_bytes_dtype_shape_arguments_and_fingerprint() -> None:
    pixels = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    cache = EncoderCache(1, "model-a")
    key = cache.key({"pixel_values": pixels}, {"layer": -1}, "first_dim")
    assert key == cache.key({"pixel_values": pixels.clone()}, {"layer": -1}, "first_dim")
    others = [
        cache.key({"pixel_values": pixels + 1}, {"layer": -1}, "first_dim"),
        cache.key({"pixel_values": pixels.reshape(4, 3)}, {"layer": -1}, "first_dim"),
        cache.key({"pixel_values": pixels.double()}, {"layer": -1}, "first_dim"),
        cache.key({"pixel_values": pixels}, {"layer": -2}, "first_dim"),
        cache.key({"pixel_values": pixels}, {"layer": -1}, "grid_rows"),
        EncoderCache(1, "model-b").key({"pixel_values": pixels}, {"layer": -1}, "first_dim"),
    ]
    assert len({key, *others}) == 1 + len(others)
    half = pixels.to(torch.bfloat16)  # no numpy dtype: hashed through its bytes
    assert cache.key({"p": half}, {}, "s") != cache.key({"p": half + 1}, {}, "s")


def test_grid_rows_cut_pixel_rows_by_each_images_grid_and_join_back() -> None:
    grid = torch.tensor([[1, 2, 2], [1, 2, 4], [1, 2, 2]])
    pixels = torch.randn(4 + 8 + 4, 6)
    parts = GridRows().split({"pixel_values": pixels, "image_grid_thw": grid}, 3)
    assert parts is not None and [p["pixel_values"].shape[0] for p in parts] == [4, 8, 4]
    joined = GridRows().join([parts[2], parts[0]])
    assert torch.equal(joined["pixel_values"], torch.cat([pixels[12:], pixels[:4]]))
    assert joined["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 2]]
    assert GridRows().split({"pixel_values": pixels[:-1], "image_grid_thw": grid}, 3) is None


def test_first_dim_splits_only_one_row_per_image() -> None:
    pixels = torch.randn(3, 3, 8, 8)
    sizes = torch.tensor([[8, 8], [8, 4], [4, 8]])
    parts = FirstDim().split({"pixel_values": pixels, "image_sizes": sizes}, 3)
    assert parts is not None and parts[1]["image_sizes"].tolist() == [[8, 4]]
    assert FirstDim().split({"pixel_values": pixels}, 2) is None  # crops: more rows than images
    assert FirstDim(per_image=False).split({"pixel_values": pixels}, 2) is not None  # tiles
    assert FirstDim().split({"pixel_values": pixels, "image_sizes": sizes[:2]}, 3) is None
    assert FirstDim().split({"pixel_values": pixels.flatten(1)}, 3) is None  # not images


def test_tiles_skip_the_padding_tiles_and_regroup_per_prompt_row() -> None:
    pixels = torch.randn(2, 3, 3, 4, 4)
    pixels[1, 2] = 0  # row 1 has two real tiles, then padding
    mask = torch.ones(2, 3, 4, 4, dtype=torch.bool)
    parts = Tiles().split({"pixel_values": pixels, "pixel_attention_mask": mask}, 2)
    assert parts is not None and len(parts) == 5
    joined = Tiles().join(parts[3:])
    assert joined["pixel_values"].shape == (1, 2, 3, 4, 4)
    assert joined["pixel_attention_mask"].shape == (1, 2, 4, 4)
    one_row = BaseModelOutputWithPooling(pooler_output=[torch.arange(6.0)[:, None]])
    cut = Tiles().unit_output(one_row, 2)  # a call on one row: its tiles' rows in order
    assert cut is not None and [f[0].tolist() for f in cut[0]] == [[[0], [1], [2]], [[3], [4], [5]]]
    features = [(torch.full((3, 1), float(k)),) for k in range(5)]
    out = Tiles().assemble(features, cut[1], {"pixel_values": pixels})
    assert [t.shape[0] for t in out.pooler_output] == [9, 6]


@pytest.mark.parametrize("stacked", [True, False])
def test_per_unit_outputs_round_trip(stacked: bool) -> None:
    rows = torch.randn(3, 5, 4)
    pooled = rows if stacked else tuple(rows)
    output = BaseModelOutputWithPooling(pooler_output=pooled, last_hidden_state=rows)
    cut = unit_features(output, 3)
    assert cut is not None and cut[1] == Layout(BaseModelOutputWithPooling, stacked, None)
    again = assembled([cut[0][2], cut[0][0]], cut[1])
    expected = [rows[2], rows[0]]
    got = list(again.pooler_output) if not stacked else list(again.pooler_output.unbind(0))
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert unit_features(output, 4) is None  # not one chunk per unit: the call runs uncached


def test_the_setting_defaults_to_256_mb_and_zero_turns_it_off(monkeypatch) -> None:
    monkeypatch.delenv("LAD_ENCODER_CACHE_MB", raising=False)
    assert Settings(_env_file=None).encoder_cache_mb == 256
    monkeypatch.setenv("LAD_ENCODER_CACHE_MB", "0")
    assert Settings(_env_file=None).encoder_cache_mb == 0
    assert not EncoderCache(0).enabled and EncoderCache(0.5).capacity_bytes == MB // 2
    with pytest.raises(ValidationError):
        Settings(_env_file=None, encoder_cache_mb=-1)
    with pytest.raises(ValueError):
        EncoderCache(-1)


def test_the_metrics_read_the_cache_at_scrape_time() -> None:
    metrics, cache = Metrics(), EncoderCache(1)
    assert "lad_encoder_cache" not in metrics.render()[0].decode()  # no cache watched yet
    metrics.watch_encoder_cache(cache.snapshot)
    cache.put(b"a", _features(1))
    cache.stats.hits, cache.stats.misses = 3, 1
    text = metrics.render()[0].decode()
    assert "lad_encoder_cache_hits_total 3.0" in text
    assert "lad_encoder_cache_misses_total 1.0" in text
    assert "lad_encoder_cache_evictions_total 0.0" in text
    assert "lad_encoder_cache_bytes 1024.0" in text
    assert "lad_encoder_cache_capacity_bytes 1.048576e+06" in text
    assert "lad_encoder_cache_entries 1.0" in text


def test_an_images_content_id_reads_its_bytes_size_and_mode_once_per_object() -> None:
    raw = bytes(range(36))
    image = Image.frombytes("RGB", (4, 3), raw)
    assert content_id(image) == content_id(Image.frombytes("RGB", (4, 3), raw))  # a twin
    others = [
        Image.frombytes("RGB", (3, 4), raw),  # same bytes, another size
        Image.frombytes("RGB", (4, 3), raw[:-1] + b"\xff"),  # one byte away
        Image.frombytes("L", (6, 6), raw),  # same bytes, another mode
    ]
    ids = {content_id(image), *(content_id(other) for other in others)}
    assert len(ids) == 4
    assert content_id(image) is content_id(image)  # kept on the object: computed once
    assert content_id(torch.zeros(3, 4, 3)) is None  # not an image: keyed by its pixels


def test_an_image_key_holds_the_image_the_preprocessing_and_the_units_own_rows() -> None:
    cache = EncoderCache(1, "model-a")
    a, b = b"a" * 32, b"b" * 32
    part = {"pixel_values": torch.zeros(16, 6), "image_grid_thw": torch.tensor([[1, 4, 4]])}

    def key(identity=a, unit=part, setting="p1", piece=0, fingerprint="model-a") -> bytes:
        owner = cache if fingerprint == "model-a" else EncoderCache(1, fingerprint)
        return owner.image_key(identity, unit, {}, "grid_rows", "pixel_values", setting, piece)

    same_pixels_other_values = {**part, "pixel_values": torch.ones(16, 6)}
    assert key() == key(unit=same_pixels_other_values)  # the pixels' bytes are not read
    moved = {**part, "image_grid_thw": torch.tensor([[1, 2, 8]])}
    variants = [key(b), key(setting="p2"), key(piece=1), key(fingerprint="b"), key(unit=moved)]
    assert len({key(), *variants}) == 6


def test_the_preprocessing_fingerprint_follows_the_image_processors_settings() -> None:
    from transformers import Qwen2VLImageProcessor

    processor = Qwen2VLImageProcessor()
    before = preprocessing_fingerprint(processor)
    assert before == preprocessing_fingerprint(Qwen2VLImageProcessor())
    processor._derived_table = list(range(10))  # private: derived state, not a setting
    assert preprocessing_fingerprint(processor) == before
    processor.image_mean = [0.1, 0.2, 0.3]
    assert preprocessing_fingerprint(processor) != before
    assert preprocessing_fingerprint(object()) == ""
