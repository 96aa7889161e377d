"""Loading real checkpoints: pixel budgets per family, a read-only Hugging Face cache used
offline without a write, and what `lad serve` says when a hub name cannot be resolved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from app.engine.interface import RetrievalItem
from app.models.loader import ModelLoadError, load_runner
from tests.live import ROOT, save_tiny_model

torch.set_num_threads(1)
SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("qwen"), "qwen2_5_vl")


def _tokens(runner, side: int = 448, n: int = 2) -> int:
    images = [Image.new("RGB", (side, side), (40 * i, 0, 0)) for i in range(n)]
    return runner.forward([RetrievalItem("q", images)]).prompt_tokens[0]


def test_qwen_pixel_budget_bounds_the_image_tokens(qwen_dir):
    pinned = _tokens(load_runner(str(qwen_dir), device="cpu", threads=1))
    small = load_runner(str(qwen_dir), device="cpu", max_pixels=112 * 112, min_pixels=56 * 56)
    large = load_runner(str(qwen_dir), device="cpu", max_pixels=448 * 448, min_pixels=56 * 56)
    # 28 x 28 pixels per image token: 16 and 256 tokens per image, two images
    assert _tokens(small) - pinned == 2 * (16 - 4)
    assert _tokens(large) - pinned == 2 * (256 - 4)
    with pytest.raises(ValueError, match="LAD_MIN_PIXELS"):
        load_runner(str(qwen_dir), device="cpu", max_pixels=56 * 56, min_pixels=112 * 112)


def test_internvl_pixel_budget_is_a_number_of_tiles():
    from app.models.internvl import InternVLAdapter
    from lad_lab.testing.families.internvl import build_processor

    processor = build_processor()  # 32 x 32 tiles
    wide = Image.new("RGB", (256, 64))

    def tiles() -> int:
        out = processor(text=["<IMG_CONTEXT>\nq"], images=[wide], return_tensors="pt")
        return int(out["pixel_values"].shape[0])

    assert tiles() == 1  # the tiny checkpoint: one tile per image
    line = InternVLAdapter.set_pixel_budget(processor, 4 * 32 * 32 + 5, None)
    assert processor.image_processor.max_patches == 4 and "5 tiles" in line
    assert tiles() == 5  # 4 tiles and the thumbnail
    InternVLAdapter.set_pixel_budget(processor, 32 * 32, None)
    assert tiles() == 1  # one tile: the whole image, not cut
    with pytest.raises(ValueError, match="LAD_MIN_PIXELS"):
        InternVLAdapter.set_pixel_budget(processor, 2 * 32 * 32, 3 * 32 * 32)


def test_a_family_without_a_pixel_budget_says_so(tmp_path, caplog):
    model_dir = save_tiny_model(tmp_path / "llava", "llava_onevision")
    with caplog.at_level("WARNING", logger="lad.model"):
        load_runner(str(model_dir), device="cpu", max_pixels=10_000)
    assert "LAD_MAX_PIXELS" in caplog.text and "ignored" in caplog.text


def test_device_map_without_accelerate_is_a_clear_error(qwen_dir):
    import importlib.util

    if importlib.util.find_spec("accelerate") is not None:  # then device_map works: use it
        runner = load_runner(str(qwen_dir), device_map="cpu")
        assert _tokens(runner) > 0
        return
    with pytest.raises(ModelLoadError, match="pip install accelerate"):
        load_runner(str(qwen_dir), device_map="auto")


def _fill_cache(hf_home: Path, source: Path, repo: str) -> Path:
    """The hub cache layout `hf download` leaves: blobs behind a snapshot and refs/main."""
    org, name = repo.split("/")
    root = hf_home / "hub" / f"models--{org}--{name}"
    snapshot = root / "snapshots" / SNAPSHOT
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(SNAPSHOT)
    return root


def _tree(path: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
    }


def _offline_env(hf_home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }


@pytest.mark.slow
def test_a_hub_name_loads_offline_from_a_read_only_cache_without_writing(tmp_path, qwen_dir):
    hf_home = tmp_path / "hf"
    _fill_cache(hf_home, qwen_dir, "lad-test/tiny-qwen")
    before = _tree(hf_home)
    for p in [hf_home, *hf_home.rglob("*")]:  # read-only as a mounted volume (root ignores it)
        p.chmod(0o555 if p.is_dir() else 0o444)
    code = (
        "from app.models.loader import load_runner\n"
        "r = load_runner('lad-test/tiny-qwen', device='cpu', threads=1)\n"
        "print('LOADED', r.model_id, r.num_layers)\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=_offline_env(hf_home),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        for p in [hf_home, *hf_home.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert "LOADED lad-test/tiny-qwen 4" in done.stdout, done.stderr[-3000:]
    assert _tree(hf_home) == before
    assert "it/s" not in done.stderr and "%|" not in done.stderr  # no progress bars


@pytest.mark.slow
def test_lad_serve_explains_a_hub_name_it_cannot_resolve(tmp_path):
    hf_home = tmp_path / "empty-hf"
    hf_home.mkdir()
    env = {
        **_offline_env(hf_home),
        "LAD_MODEL": "lad-test/does-not-exist",
        "LAD_STORE_URL": "memory://",
    }
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", "0"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 3, out
    for needed in (
        "lad-test/does-not-exist",
        "HF_HUB_OFFLINE",
        "HF_HOME",
        str(hf_home),
        "hf download lad-test/does-not-exist",
        "LAD_MODEL",
    ):
        assert needed in out, needed
    assert "Traceback" not in out
    assert not any(hf_home.iterdir())  # nothing written to the cache
