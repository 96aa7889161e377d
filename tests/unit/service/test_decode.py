"""The decode stage on its own: bounded cost (draft mode, one resize to the model's budget,
the request's pixel budget), the format allowlist, and conversions a person would expect."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from app import errors
from app.service.decode import Decoder, check_header, sniff_format, target_size
from app.service.decode import decoder as decode
from app.service.decode import headers as image_headers
from app.settings import Settings
from lad_lab.testing import hostile

BUDGET = 56 * 56


def _settings(**kw) -> Settings:
    return Settings(_env_file=None, store_url="memory://", **kw)


def _decoder(budget: int | None = BUDGET, tokens=("<|image_pad|>", "<|im_end|>"), **kw):
    return Decoder(_settings(**kw), pixel_budget=budget, special_tokens=tokens)


def _encode(image: Image.Image, fmt: str = "PNG", **save) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save)
    return buffer.getvalue()


def _one(decoder: Decoder, raw: bytes | str) -> Image.Image:
    return decoder.images([raw], "images")[0]


def _quadrants(size: int = 64) -> Image.Image:
    """Red top-left, green top-right, blue bottom-left, white bottom-right."""
    image = Image.new("RGB", (size, size), "white")
    half = size // 2
    image.paste((255, 0, 0), (0, 0, half, half))
    image.paste((0, 255, 0), (half, 0, size, half))
    image.paste((0, 0, 255), (0, half, half, size))
    return image


def test_target_size_keeps_the_aspect_ratio_within_the_budget() -> None:
    assert target_size(224, 224, BUDGET) == (56, 56)
    assert target_size(40, 30, BUDGET) == (40, 30)  # never upscales
    assert target_size(4096, 4096, None) == (4096, 4096)
    for w, h in [(4096, 2048), (1000, 10), (10, 1000), (333, 777), (4000, 40)]:
        tw, th = target_size(w, h, BUDGET)
        assert tw * th <= BUDGET
        assert abs((tw / th) / (w / h) - 1) < 0.15, (w, h, tw, th)


def test_a_large_jpeg_is_decoded_at_reduced_scale_and_resized_once() -> None:
    decoder = _decoder()
    big = _quadrants(4096)
    raw = _encode(big, "JPEG", quality=90)
    probe = decoder._probe(raw, "images[0]")
    assert probe.image.size == (512, 512)  # draft: 1/8 scale, the decoder never sees 4096²
    probe.image.close()
    out = _one(decoder, raw)
    assert out.size == (56, 56) and out.mode == "RGB"
    assert out.getpixel((5, 5))[0] > 200 and out.getpixel((50, 50)) > (200, 200, 200)


def test_decode_resizes_straight_to_the_processors_size_when_the_model_names_it() -> None:
    asked: list[tuple[int, int]] = []

    def exact(width: int, height: int) -> tuple[int, int]:
        asked.append((width, height))
        return 84, 56  # e.g. sides multiples of 28, a size the processor then keeps

    decoder = Decoder(_settings(), pixel_budget=BUDGET, image_size=exact)
    out = _one(decoder, _encode(_quadrants(4096).resize((4096, 2730)), "JPEG", quality=90))
    assert out.size == (84, 56) and asked == [(4096, 2730), (84, 56)]
    # a size the processor would change again: decode keeps the budget rule
    moving = Decoder(_settings(), pixel_budget=BUDGET, image_size=lambda w, h: (w // 2, h // 2))
    assert _one(moving, _encode(_quadrants(224))).size == (56, 56)
    # a size above the image (the processor would upscale): decode keeps the budget rule
    small = Decoder(_settings(), pixel_budget=BUDGET, image_size=lambda w, h: (w * 2, h * 2))
    assert _one(small, _encode(_quadrants(40))).size == (40, 40)


def test_the_request_pixel_budget_counts_decoded_pixels() -> None:
    decoder = _decoder(max_request_pixels=3 * 512 * 512)
    jpeg = _encode(_quadrants(4096), "JPEG")
    assert len(decoder.images([jpeg] * 3, "images")) == 3  # three 512² drafts fit
    with pytest.raises(errors.ImageTooLarge, match="LAD_MAX_REQUEST_PIXELS"):
        decoder.images([jpeg] * 4, "images")
    png = _encode(Image.new("RGB", (1024, 1024), "white"))  # no draft for PNG: 1 M pixels
    with pytest.raises(errors.ImageTooLarge, match="LAD_MAX_REQUEST_PIXELS"):
        decoder.images([png], "images")


def test_header_size_limit_refuses_a_bomb_before_decoding() -> None:
    bomb = _encode(Image.new("1", (20000, 20000)))  # 400 M pixels in a few KB
    assert len(bomb) < 100_000
    with pytest.raises(errors.ImageTooLarge):
        _one(_decoder(), bomb)
    with pytest.raises(errors.ImageTooLarge, match="LAD_MAX_IMAGE_PIXELS"):
        _one(_decoder(max_image_pixels=100 * 100), _encode(Image.new("RGB", (200, 200))))


def test_exif_orientation_is_applied() -> None:
    image = _quadrants(64)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: display needs a 90° clockwise turn
    out = _one(_decoder(budget=None), _encode(image, "JPEG", exif=exif, quality=95))
    # after a clockwise turn, the red top-left quadrant is at the top right
    assert out.getpixel((56, 8))[0] > 200 and out.getpixel((8, 8))[2] > 200


def test_transparency_is_composited_on_white() -> None:
    rgba = Image.new("RGBA", (32, 32), (255, 0, 0, 0))  # fully transparent red
    rgba.paste((0, 0, 255, 255), (0, 0, 16, 32))
    out = _one(_decoder(), _encode(rgba))
    assert out.getpixel((24, 16)) == (255, 255, 255) and out.getpixel((4, 16)) == (0, 0, 255)
    palette = Image.new("P", (32, 32), 0)
    palette.putpalette([0, 0, 0, 0, 255, 0] + [0] * 762)
    palette.paste(1, (16, 0, 32, 32))
    out = _one(_decoder(), _encode(palette, transparency=0))  # index 0 transparent
    assert out.getpixel((4, 4)) == (255, 255, 255) and out.getpixel((20, 4)) == (0, 255, 0)
    la = Image.new("LA", (16, 16), (0, 0))
    assert _one(_decoder(), _encode(la)).getpixel((3, 3)) == (255, 255, 255)


def test_cmyk_and_16_bit_become_the_right_rgb() -> None:
    cmyk = Image.new("CMYK", (32, 32), (0, 255, 255, 0))  # red in CMYK
    out = _one(_decoder(), _encode(cmyk, "JPEG", quality=95))
    r, g, b = out.getpixel((16, 16))
    assert r > 200 and g < 60 and b < 60
    deep = Image.fromarray(np.full((32, 32), 40000, dtype=np.uint16))  # I;16 grey at 61 %
    assert deep.mode.startswith("I")
    r, g, b = _one(_decoder(), _encode(deep)).getpixel((5, 5))
    assert r == g == b and abs(r - 40000 / 257) < 2  # not clipped to white


def test_animated_gif_and_webp_give_their_first_frame() -> None:
    frames = [Image.new("RGB", (16, 16), c) for c in ("red", "blue", "green")]
    for fmt in ("GIF", "WEBP"):
        raw = _encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=50, loop=0)
        r, _g, b = _one(_decoder(), raw).getpixel((8, 8))
        assert r > 200 and b < 60, fmt


def test_formats_outside_the_allowlist_are_refused_by_name() -> None:
    decoder = _decoder()
    tiff = _encode(Image.new("RGB", (8, 8)), "TIFF")
    cases = {
        "TIFF": tiff,
        "PDF": b"%PDF-1.7\n1 0 obj<<>>endobj\n",
        "PostScript/EPS": b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n",
        "SVG": b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"/>',
        "ICO": _encode(Image.new("RGB", (16, 16)), "ICO"),
    }
    for name, raw in cases.items():
        assert sniff_format(raw) == name
        with pytest.raises(errors.UnsupportedImageFormat, match=name.split("/")[0]):
            _one(decoder, raw)
    assert _one(_decoder(image_formats="JPEG,PNG,TIFF"), tiff).size == (8, 8)  # opt-in
    with pytest.raises(errors.UnsupportedImageFormat, match="GIF"):
        _one(_decoder(image_formats="JPEG,PNG"), _encode(Image.new("RGB", (8, 8)), "GIF"))


@pytest.mark.parametrize("fmt", ["PPM", "PCX", "TGA"])
def test_formats_pillow_names_by_header_are_415_not_400(fmt: str) -> None:
    """The docs promise 415 for a format outside LAD_IMAGE_FORMATS; TGA has no signature."""
    raw = _encode(Image.new("RGB", (8, 8), "red"), fmt)
    with pytest.raises(errors.UnsupportedImageFormat, match=fmt):
        _one(_decoder(), raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00" * 64,
        b"hello, I am text",
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 40,
        b"\xff\xd8\xff\xe0" + b"\x00" * 10,
    ],
    ids=["empty", "zeros", "text", "png-header-only", "jpeg-header-only"],
)
def test_unreadable_bytes_are_400_without_internals(raw: bytes) -> None:
    with pytest.raises(errors.InvalidImage) as info:
        _one(_decoder(), raw)
    assert "0x" not in info.value.message and "BytesIO" not in info.value.message


def test_truncated_png_is_400() -> None:
    raw = _encode(Image.effect_noise((64, 64), 50).convert("RGB"))
    with pytest.raises(errors.InvalidImage, match="truncated or corrupt"):
        _one(_decoder(), raw[: len(raw) // 2])


def test_base64_and_data_urls() -> None:
    decoder = _decoder()
    raw = _encode(Image.new("RGB", (8, 8), "red"))
    text = base64.b64encode(raw).decode()
    wrapped = "\n".join(text[i : i + 20] for i in range(0, len(text), 20))
    for good in (
        text,
        wrapped,
        f"data:image/png;base64,{text}",
        f"  data:image/jpeg;name=x.png;base64,{text}\n",
    ):
        assert _one(decoder, good).size == (8, 8)
    for bad in (
        "not base64!!",
        "data:text/plain;base64," + text,
        "data:image/png," + text,
        "data:image/png;base64",
        "é" * 12,
        text[:-3],
    ):
        with pytest.raises(errors.InvalidImage):
            _one(decoder, bad)


def test_extreme_aspect_ratios_are_refused_with_the_setting() -> None:
    for size in [(1, 4000), (4000, 1), (3, 400)]:
        with pytest.raises(errors.UnsupportedImage, match="LAD_MAX_ASPECT_RATIO=100"):
            _one(_decoder(), _encode(Image.new("RGB", size)))
    assert _one(_decoder(), _encode(Image.new("RGB", (10, 900)))).size[1] > 0


def test_user_text_rules() -> None:
    decoder = _decoder(max_query_chars=50)
    assert decoder.query("a red star") == "a red star"
    for bad, why in [
        ("", "empty"),
        ("  ", "empty"),
        ("x" * 51, "LAD_MAX_QUERY_CHARS"),
        ("a <|image_pad|> b", "special token"),
        ("a\x00b", "control"),
        ("a\ud800b", "surrogate"),
    ]:
        with pytest.raises(errors.InvalidQuery, match=why):
            decoder.query(bad)
    assert decoder.query("tabs\tand\nnewlines are text") is not None


def test_label_limits() -> None:
    decoder = _decoder(max_label_chars=5, max_label_tokens=10)
    assert list(decoder.labels(3, "digits").strings) == ["1", "2", "3"]
    with pytest.raises(errors.InvalidLabels, match="LAD_MAX_LABEL_CHARS=5"):
        list(decoder.labels(2, ["short", "longer one"]).strings)
    with pytest.raises(errors.InvalidLabels, match="special token"):
        list(_decoder().labels(2, ["a", "<|im_end|>"]).strings)
    with pytest.raises(errors.TooFewImages):
        list(decoder.labels(1, "digits").strings)
    with pytest.raises(errors.TooManyImages, match="LAD_MAX_IMAGES=12"):
        list(decoder.labels(13, "digits").strings)
    decoder.check_label_tokens([5, 5])
    with pytest.raises(errors.InvalidLabels, match="LAD_MAX_LABEL_TOKENS=10"):
        decoder.check_label_tokens([5, 6])


def test_shared_decode_threads_give_the_same_images_in_order(monkeypatch) -> None:
    monkeypatch.setattr(decode, "THREADED_PIXELS", 0)  # every request through the threads
    rng = np.random.default_rng(3)
    raws = [
        _encode(
            Image.fromarray(rng.integers(0, 255, (300 + 37 * i, 280, 3), dtype=np.uint8)),
            "JPEG" if i % 2 else "PNG",
        )
        for i in range(6)
    ]
    threaded = _decoder(decode_threads=4).images(raws, "images")
    serial = _decoder(decode_threads=1).images(raws, "images")
    assert [im.size for im in threaded] == [im.size for im in serial]
    for a, b in zip(threaded, serial, strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_a_bad_image_among_threaded_decodes_is_named(monkeypatch) -> None:
    monkeypatch.setattr(decode, "THREADED_PIXELS", 0)
    good = _encode(_quadrants(200))
    noise = _encode(Image.effect_noise((200, 200), 50).convert("RGB"))
    truncated = noise[: len(noise) // 2]  # the header reads: it fails while decoding
    with pytest.raises(errors.InvalidImage, match=r"images\[2\] is truncated"):
        _decoder(decode_threads=4).images([good, good, truncated, good], "images")


def _real_world_headers() -> dict[str, bytes]:
    """Images whose headers carry what cameras and editors write: EXIF, a large ICC profile
    (split over APP2 segments), progressive scans, PNG text and colour chunks."""
    photo = _quadrants(256)
    exif = Image.Exif()
    exif[0x0112] = 6
    exif[0x010F] = "camera maker"
    info = PngImagePlugin.PngInfo()
    for i in range(200):
        info.add_text(f"key{i}", "value " * 50, zip=i % 2 == 0)
    return {
        "jpeg-exif-icc": _encode(photo, "JPEG", exif=exif, icc_profile=b"\0" * 300_000),
        "jpeg-progressive": _encode(photo, "JPEG", progressive=True, quality=90),
        "png-text-icc": _encode(photo, "PNG", pnginfo=info, icc_profile=b"\0" * 100_000),
        "png-exif": _encode(photo, "PNG", exif=exif),
        "gif-comment": _encode(photo.convert("P"), "GIF", comment=b"made here " * 300),
        "webp-exif-icc": _encode(photo, "WEBP", exif=exif, icc_profile=b"\0" * 100_000),
    }


@pytest.mark.parametrize("name", list(_real_world_headers()))
def test_real_headers_are_within_the_header_bounds(name: str) -> None:
    raw = _real_world_headers()[name]
    check_header(raw, name)
    assert _one(_decoder(), raw).size == (56, 56)


def test_header_bounds_refuse_past_the_limit_not_before() -> None:
    check_header(hostile.jpeg_with_app_segments(1000), "x")
    check_header(hostile.gif_with_comment_blocks(image_headers.MAX_GIF_BLOCKS - 2), "x")
    check_header(hostile.webp_with_exif(b"\0" * (image_headers.MAX_EXIF_BYTES - 6)), "x")
    check_header(hostile.png_with_chunks(b"tEXt", b"k\0v", image_headers.MAX_PNG_TEXT_CHUNKS), "x")
    check_header(hostile.png_with_chunks(b"prVt", b"", image_headers.MAX_PNG_CHUNKS - 10), "x")
    refused = {
        "app15": hostile.jpeg_with_app_segments(2_000_000),
        "text": hostile.png_with_chunks(b"tEXt", b"k\0v", image_headers.MAX_PNG_TEXT_CHUNKS + 1),
        "chunks": hostile.png_with_chunks(b"prVt", b"", image_headers.MAX_PNG_CHUNKS + 1),
        "exif": hostile.png_with_exif(b"\0" * (image_headers.MAX_EXIF_BYTES + 1)),
        "gif": hostile.gif_with_comment_blocks(image_headers.MAX_GIF_BLOCKS),
        "webp-exif": hostile.webp_with_exif(b"\0" * (image_headers.MAX_EXIF_BYTES + 1)),
    }
    for name, raw in refused.items():
        with pytest.raises(errors.UnsupportedImage, match="no real image needs that many"):
            check_header(raw, name)
    with pytest.raises(errors.UnsupportedImage):  # through the decoder, before Pillow
        _one(_decoder(), refused["app15"])


def test_progressive_jpeg_scans_times_pixels_is_bounded() -> None:
    """256 scans are within MAX_JPEG_SCANS, but not over a large image (issue 29)."""
    side = 1100  # 1.21 M pixels: 221 scans fit the product, 222 do not
    fits = image_headers.MAX_JPEG_SCAN_PIXELS // (side * side)
    check_header(hostile.progressive_jpeg_with_scans(side, fits), "x")
    check_header(hostile.progressive_jpeg_with_scans(64, 256), "x")  # small: many scans fine
    raw = hostile.progressive_jpeg_with_scans(side, fits + 1)
    with pytest.raises(errors.UnsupportedImage, match="MAX_JPEG_SCAN_PIXELS"):
        _one(_decoder(), raw)


def test_one_icc_profile_per_png_and_compressed_chunks_are_bounded() -> None:
    check_header(hostile.png_with_icc_profiles(1), "x")
    assert _one(_decoder(), hostile.png_with_icc_profiles(1, 1000)).size == (32, 32)
    with pytest.raises(errors.UnsupportedImage, match="MAX_PNG_ICC_PROFILES"):
        _one(_decoder(), hostile.png_with_icc_profiles(2))
    big = hostile.png_with_chunks(
        b"zTXt", b"k\0\0" + bytes(image_headers.MAX_PNG_COMPRESSED_CHUNK_BYTES), 1
    )
    with pytest.raises(errors.UnsupportedImage, match="MAX_PNG_COMPRESSED_CHUNK_BYTES"):
        check_header(big, "x")


def test_requests_holding_bodies_decode_in_turn_within_the_budget(monkeypatch) -> None:
    """Four requests at once, two decode slots, each holding a body and decoding one image
    whose pixels take the budget's whole headroom: they decode in turn, none waits out the
    budget's wait, and the bytes held never pass LAD_MAX_INFLIGHT_BYTES (issue 41: the old
    rule let such requests run "alone" beside the others' bodies, over the capacity)."""
    import asyncio
    import time

    from app import budget as byte_budget

    monkeypatch.setattr(byte_budget, "BUDGET_WAIT_S", 5.0)
    decoder = _decoder(
        budget=None,
        max_inflight_bytes=8 * 2**20,
        max_image_pixels=1024 * 1024,  # headroom: 4 MiB, one 1024² image
        max_concurrent_decodes=2,
        decode_threads=1,
    )
    raw = _encode(Image.new("RGB", (1024, 1024), (200, 30, 30)))
    used: list[int] = []
    grow = byte_budget.Account.grow

    def watched_grow(self, n: int, what: str) -> int:
        held = grow(self, n, what)
        used.append(self.budget.used)
        return held

    monkeypatch.setattr(byte_budget.Account, "grow", watched_grow)

    async def request() -> int:
        account = byte_budget.Account(decoder.budget)
        token = byte_budget.ACCOUNT.set(account)
        try:
            await account.admit(900 * 1024, "the request body")
            async with decoder.slot():
                images = await asyncio.to_thread(decoder.images, [raw], "images")
            return images[0].size[0]
        finally:
            byte_budget.ACCOUNT.reset(token)
            account.close()

    async def main() -> list[int]:
        return await asyncio.gather(*(request() for _ in range(4)))

    start = time.monotonic()
    assert asyncio.run(main()) == [1024] * 4
    assert time.monotonic() - start < 4  # in turn, not after a wait runs out
    assert len(used) == 4 and max(used) <= 8 * 2**20
    assert decoder.budget.used == 0 and decoder.budget.peak <= 8 * 2**20


def test_a_url_that_reaches_the_decoder_is_refused_not_read_as_base64() -> None:
    """The fetch stage replaces every URL it may fetch; one left over is refused as a URL."""
    for url in ("https://cdn.example.com/a.png", " file:///etc/passwd"):
        assert decode.is_url(url)
        with pytest.raises(errors.MediaNotAllowed, match="is a URL"):
            _one(_decoder(), url)
