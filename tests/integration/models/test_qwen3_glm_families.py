"""Qwen3-VL, Qwen3.5 (hybrid linear/full attention) and GLM-4V on tiny random models.

The capture, fold, cached-step and brute-force checks run over these families through
``tiny_models.FAMILIES`` (tests/integration/engine/). Here: a saved checkpoint is served
through ``LAD_MODEL`` and the loader, a batch mixing N = 3 and N = 5 equals each item
alone, ``lad bench attention`` holds the capture to eager attention, the decode resize is
the processor's own, and Qwen3.5's Λ holds only layers with softmax attention.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from app.cli import main as lad
from app.engine import runner as runner_module
from app.engine.attention import default_layers, eager_attentions, span_mass
from app.engine.runner import RetrievalItem, Runner, chain_path
from app.main import load_runner_from_settings
from app.method import debias
from app.models.glm4v import Glm4vAdapter
from app.models.loader import load_runner, make_runner
from app.models.qwen3_5 import Qwen3_5Adapter
from app.models.qwen3_vl import Qwen3VLAdapter
from app.settings import Settings
from lad_lab.testing.tiny_models import build_tiny, random_images, tiny_runner
from tests.integration.engine.reference import brute_force_scores

torch.set_num_threads(1)

ADAPTERS = {"qwen3_vl": Qwen3VLAdapter, "qwen3_5": Qwen3_5Adapter, "glm4v": Glm4vAdapter}
FAMILIES = tuple(ADAPTERS)


def _items(seed: int = 0) -> list[RetrievalItem]:
    """N = 3 and N = 5, images of different sizes, so the first row is left-padded."""
    images = random_images(8, seed=seed, sizes=[(48, 48), (70, 40), (40, 64)])
    return [RetrievalItem("a red boat", images[:3]), RetrievalItem("two cats", images[3:8])]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


def test_checkpoint_dir_is_served_through_lad_model(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_pretrained -> LAD_MODEL=<dir>: config.json names the family, the processor is
    rebuilt offline, and the served model answers as the in-memory one."""
    model, processor = build_tiny(family, seed=2)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == family
    monkeypatch.setenv("LAD_MODEL", str(tmp_path))
    monkeypatch.setenv("LAD_DEVICE", "cpu")
    monkeypatch.setenv("LAD_TORCH_THREADS", "1")
    served = load_runner_from_settings(Settings())
    assert type(served.adapter) is ADAPTERS[family]
    assert served.adapter.chat_template() == processor.chat_template
    in_memory = make_runner(model, processor)
    assert served.layers == in_memory.layers
    a, b = in_memory.forward(_items(7)), served.forward(_items(7))
    for x, y in zip(a.scores + a.attention, b.scores + b.attention, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_moe_variant_is_served_by_the_same_adapter(family: str, tmp_path: Path) -> None:
    """qwen3_vl_moe, qwen3_5_moe, glm4v_moe: the dense family's layout with experts in the
    MLPs; saved and loaded, the family's adapter serves it and the capture equals eager.
    The Qwen ones on the byte-level vocabulary: reading a released 151k-token tokenizer.json
    back costs ~20 s on a busy CPU and is the checkpoint test's above, not this one's."""
    vocab = {} if family == "glm4v" else {"vocab": "bytes"}
    model, processor = build_tiny(family, moe=True, **vocab)
    assert model.config.model_type == f"{family}_moe"
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    served = load_runner(str(tmp_path), device="cpu", threads=1)
    assert type(served.adapter) is ADAPTERS[family]
    items = _items(2)
    result = served.forward(items)
    batch = served.process(items)
    attentions = eager_attentions(served.model, served.adapter, batch, logits_to_keep=1)
    for row, n in enumerate(batch.n_images):
        spans = served.adapter.image_spans(batch.input_ids[row], n)
        expected = span_mass(attentions, row, -1, served.layers, spans)
        np.testing.assert_allclose(result.attention[row], expected, atol=1e-5, rtol=0)
        assert float(np.exp(result.scores[row]).sum()) == pytest.approx(1.0, abs=1e-9)


# what the released checkpoints name (torchvision-backed image and video processors)
RELEASED = {
    "qwen3_vl": ("Qwen2VLImageProcessorFast", "Qwen3VLProcessor", "Qwen3VLVideoProcessor"),
    "qwen3_5": ("Qwen2VLImageProcessorFast", "Qwen3VLProcessor", "Qwen3VLVideoProcessor"),
    "glm4v": ("Glm4vImageProcessor", "Glm4vProcessor", "Glm4vVideoProcessor"),
}


def test_released_processor_layout_loads_without_torchvision(family: str, tmp_path: Path) -> None:
    """preprocessor_config.json + video_preprocessor_config.json naming the released
    (torchvision) classes: the adapter rebuilds its processor offline from the parts."""
    model, processor = build_tiny(family)
    processor.save_pretrained(tmp_path)
    image_type, processor_type, video_type = RELEASED[family]
    saved = json.loads((tmp_path / "processor_config.json").read_text())["image_processor"]
    saved.update(image_processor_type=image_type, processor_class=processor_type)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(saved))
    (tmp_path / "video_preprocessor_config.json").write_text(
        json.dumps({"video_processor_type": video_type, "processor_class": processor_type})
    )
    (tmp_path / "processor_config.json").unlink()
    loaded = ADAPTERS[family].load_processor(str(tmp_path))
    assert isinstance(loaded, ADAPTERS[family].processor_class)
    assert loaded.image_processor.size == processor.image_processor.size
    adapter = ADAPTERS[family](model, loaded)
    batch = adapter.process([adapter.render(2, "q")], [random_images(2)])
    assert len(adapter.image_spans(batch.input_ids[0], 2)) == 2


def test_mixed_batch_of_three_and_five_equals_each_item_alone(family: str, shared_runner) -> None:
    runner = shared_runner(family, seed=1)
    items = _items(3)
    batched = runner.forward(items)
    for k, item in enumerate(items):
        alone = runner.forward([item])
        n = len(item.images)
        assert batched.scores[k].shape == (n,)
        assert float(np.exp(batched.scores[k]).sum()) == pytest.approx(1.0, abs=1e-9)
        assert batched.attention[k].shape == (len(runner.layers), n)
        np.testing.assert_allclose(alone.scores[0], batched.scores[k], atol=1e-5, rtol=0)
        np.testing.assert_allclose(alone.attention[0], batched.attention[k], atol=1e-5, rtol=0)


def test_labels_that_branch_score_through_cached_steps_as_teacher_forcing(
    family: str, shared_runner
) -> None:
    """Labels "10".."21": every Qwen BPE (and a byte-level one) writes digits one token each,
    so the trie branches below the root at "1" and at "2", off one path: their scores need
    cached steps on row copies of the prompt cache (Qwen3.5: of its linear-attention conv
    and recurrent states too), which must equal teacher forcing."""
    runner = shared_runner(family, seed=4)
    labels = [str(10 + k) for k in range(12)]
    assert chain_path(runner.label_trie(labels)) is None  # no single chain to fold
    items = [RetrievalItem(q, random_images(12, seed=s)) for q, s in (("a dog", 5), ("a boat", 6))]
    calls: list[int] = []
    handle = runner.model.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        result = runner.forward(items, labels=labels)
    finally:
        handle.remove()
    assert calls[1:] == [1]  # after the prompt: one cached step, for the depth-1 branches
    for item, scores in zip(items, result.scores, strict=True):
        np.testing.assert_allclose(
            scores, brute_force_scores(runner, item, labels), atol=1e-5, rtol=0
        )


def test_lad_bench_attention_finds_captured_equal_to_eager(family: str, tmp_path: Path) -> None:
    out = tmp_path / "attention.json"
    code = lad(
        [
            "bench",
            "attention",
            "--models",
            f"tiny-{family}",
            "--dtypes",
            "float32",
            "--n",
            "3",
            "--side",
            "64",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    (check,) = json.loads(out.read_text())["checks"]
    assert check["model"] == f"tiny-{family}" and check["ok"]
    assert check["max_abs_diff"] <= 1e-5 and 0 < check["captured_mass_mean"] <= 1.0 + 1e-6


def test_decode_resize_is_the_processors_own(family: str, shared_runner) -> None:
    """image_size_for names the size the processor resizes to, so decode can resize once."""
    runner = shared_runner(family, image_pixels=112)
    adapter, image_processor = runner.adapter, runner.processor.image_processor
    patch = image_processor.patch_size
    for width, height in [(300, 120), (90, 200), (112, 112)]:
        size = adapter.image_size_for(width, height)
        image = random_images(1, sizes=[(width, height)])[0]
        grid = runner.process([RetrievalItem("q", [image])]).inputs["image_grid_thw"][0]
        assert size == (int(grid[2]) * patch, int(grid[1]) * patch)
    assert adapter.image_pixel_budget() == 112 * 112


def test_pixel_budget_counts_pixels_per_image(family: str) -> None:
    """LAD_MAX_PIXELS is pixels of one image in every family (GLM's processor counts an
    image twice); the log line names the tokens it allows."""
    model, processor = build_tiny(family)
    line = ADAPTERS[family].set_pixel_budget(processor, 64 * 64 * 4, 64 * 64)
    adapter = ADAPTERS[family](model, processor)
    assert adapter.image_pixel_budget() == 64 * 64 * 4
    side = processor.image_processor.patch_size * processor.image_processor.merge_size
    assert f"at most {64 * 64 * 4 // side**2} image tokens" in line
    with pytest.raises(ValueError, match="LAD_MIN_PIXELS"):
        ADAPTERS[family].set_pixel_budget(processor, 64 * 64, 128 * 128)


def test_qwen3_5_lambda_holds_only_full_attention_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """12 layers in the released pattern (every fourth full): Λ = the full-attention layers
    from round(0.58 L) on, and the capture is never asked for a linear-attention layer."""
    runner = tiny_runner("qwen3_5", num_hidden_layers=12, full_attention_interval=4)
    kinds = runner.model.config.text_config.layer_types
    full = tuple(i for i, kind in enumerate(kinds) if kind == "full_attention")
    assert full == (3, 7, 11) == runner.adapter.attention_layers()
    assert runner.layers == (7, 11)
    asked: list[tuple[int, ...]] = []
    real_capture = runner_module.capture

    def recording_capture(layers, *args):
        asked.append(tuple(layers))
        return real_capture(layers, *args)

    monkeypatch.setattr(runner_module, "capture", recording_capture)
    items = _items(5)
    result = runner.forward(items)
    assert asked == [(7, 11)]
    batch = runner.process(items)
    attentions = eager_attentions(runner.model, runner.adapter, batch, logits_to_keep=1)
    assert [i for i, a in enumerate(attentions) if a is not None] == list(full)
    assert result.attention[0].shape == (2, 3)
    model, processor = build_tiny("qwen3_5", num_hidden_layers=12, full_attention_interval=4)
    with pytest.raises(ValueError, match="3, 7, 11"):
        make_runner(model, processor, layers=(6, 7))


def test_default_layers_keep_only_attention_layers() -> None:
    assert default_layers(12, attention_layers=range(12)) == default_layers(12)
    assert default_layers(12, attention_layers=(3, 7, 11)) == (7, 11)
    assert default_layers(8, attention_layers=(0, 1)) == (0, 1)  # none that late: the last K
    with pytest.raises(ValueError, match="softmax attention"):
        default_layers(4, attention_layers=())


def test_qwen3_vl_shared_images_keep_their_deepstack_features(shared_runner) -> None:
    """perm_avg's rotations encode each image once; the deepstack features added to the
    first decoder layer are reordered with the image features, so answers equal copies'."""
    runner: Runner = shared_runner("qwen3_vl")
    images = random_images(3, seed=4, sizes=[(48, 48), (80, 48), (48, 96)])
    orders = debias.rotations(3)
    shared = [RetrievalItem("a cat", [images[p] for p in o]) for o in orders]
    copies = [RetrievalItem("a cat", [images[p].copy() for p in o]) for o in orders]
    x, y = runner.forward(shared), runner.forward(copies)
    for s, t in zip(x.scores + x.attention, y.scores + y.attention, strict=True):
        np.testing.assert_allclose(s, t, atol=1e-6, rtol=0)
