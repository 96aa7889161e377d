"""Gemma 3, Idefics3, SmolVLM and Mistral 3 end to end on tiny random models built in code.

For each family: a checkpoint directory saved from the tiny instance is served through the
real loading path (family picked from config.json, processor rebuilt offline); a batch
mixing N = 3 and N = 5 equals each item run alone; scores are a distribution; every image
token lies in its image's span; `lad bench attention` finds captured == eager. For Gemma 3,
Λ holds global layers only, and a sliding-window layer's t_q row indeed reaches no image.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from app.engine.attention import default_layers, eager_attentions, span_mass
from app.engine.runner import RetrievalItem, Runner
from app.models.gemma3 import Gemma3Adapter
from app.models.idefics3 import Idefics3Adapter, SmolVLMAdapter
from app.models.loader import load_runner, make_runner
from app.models.mistral3 import Mistral3Adapter
from lad_lab.bench import attention_check
from lad_lab.testing.tiny_models import build_tiny, random_images, tiny_runner

torch.set_num_threads(1)

ADAPTERS = {
    "gemma3": Gemma3Adapter,
    "idefics3": Idefics3Adapter,
    "smolvlm": SmolVLMAdapter,
    "mistral3": Mistral3Adapter,
}
FAMILIES = tuple(ADAPTERS)


def mixed_items(seed: int = 0) -> list[RetrievalItem]:
    """N = 3 and N = 5, images of different sizes and aspect ratios (different tilings)."""
    return [
        RetrievalItem("a red square", random_images(3, seed=seed, sizes=[(48, 48), (20, 50)])),
        RetrievalItem(
            "two dogs on a blue sofa",
            random_images(5, seed=seed + 1, sizes=[(64, 40), (30, 30), (60, 20)]),
        ),
    ]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def saved(family: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Runner]:
    """The checkpoint directory and an in-memory runner over the same weights."""
    model, processor = build_tiny(family, seed=2)
    directory = tmp_path_factory.mktemp(family)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory, make_runner(model, processor, model_id=f"tiny-{family}")


def test_a_saved_checkpoint_is_served_by_the_loading_path(family: str, saved) -> None:
    directory, in_memory = saved
    assert json.loads((directory / "config.json").read_text())["model_type"] == family
    loaded = load_runner(str(directory), device="cpu", threads=1)
    assert type(loaded.adapter) is ADAPTERS[family]
    assert loaded.adapter.chat_template() == in_memory.adapter.chat_template()
    assert loaded.layers == in_memory.layers
    items = mixed_items(seed=7)
    a, b = in_memory.forward(items), loaded.forward(items)
    assert a.prompt_tokens == b.prompt_tokens
    for x, y in zip(a.scores + a.attention, b.scores + b.attention, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6, rtol=0)


def test_a_mixed_batch_equals_its_items_alone(family: str, saved) -> None:
    _, runner = saved
    items = mixed_items(seed=3)
    batch = runner.forward(items)
    assert [len(s) for s in batch.scores] == [3, 5]
    for item, scores, attention in zip(items, batch.scores, batch.attention, strict=True):
        assert np.exp(scores).sum() == pytest.approx(1.0, abs=1e-9)
        alone = runner.forward([item])
        np.testing.assert_allclose(scores, alone.scores[0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(attention, alone.attention[0], atol=1e-5, rtol=0)
        assert attention.shape == (len(runner.layers), len(item.images))
        assert np.all(attention > 0) and np.all(attention.sum(-1) < 1 + 1e-6)


def test_every_image_token_lies_in_its_image_span(family: str, saved) -> None:
    _, runner = saved
    items = mixed_items(seed=5)
    batch = runner.process(items)
    image_id = int(runner.model.config.image_token_id)
    for row, item in enumerate(items):
        ids = batch.input_ids[row]
        spans = runner.adapter.image_spans(ids, len(item.images))
        assert all(e <= s2 for (_, e), (s2, _) in itertools.pairwise(spans))
        covered = sum(int((ids[s:e] == image_id).sum()) for s, e in spans)
        assert covered == int((ids == image_id).sum()) > 0
        if family != "gemma3":  # tiled / size-dependent layouts: different images, lengths
            assert len({e - s for s, e in spans}) > 1


def test_lad_bench_attention_finds_capture_equal_to_eager(tmp_path: Path) -> None:
    out = tmp_path / "attention.json"
    models = ",".join(f"tiny-{family}" for family in FAMILIES)
    argv = ["--models", models, "--dtypes", "float32", "--n", "3", "--side", "32"]
    assert attention_check.main([*argv, "--out", str(out)]) == 0
    checks = json.loads(out.read_text())["checks"]
    assert [c["model"] for c in checks] == [f"tiny-{family}" for family in FAMILIES]
    assert all(c["ok"] and c["max_abs_diff"] <= 1e-5 for c in checks)


def test_gemma3_lambda_holds_only_global_layers() -> None:
    runner = tiny_runner("gemma3")
    types = runner.model.config.text_config.layer_types
    assert list(runner.adapter.attention_layers()) == [
        i for i, t in enumerate(types) if t == "full_attention"
    ]
    assert list(runner.adapter.attention_layers()) == [2, 5, 7]
    assert runner.layers == (5, 7)  # round(0.58 * 8) .. 7 without the sliding layer 6
    with pytest.raises(ValueError, match="softmax attention"):
        make_runner(runner.model, runner.processor, layers=(6, 7))  # tiny_runner would filter
    # a sliding layer's t_q row cannot reach the images (window 32 < the text after them)
    items = mixed_items()
    batch = runner.process(items)
    attentions = eager_attentions(runner.model, runner.adapter, batch, logits_to_keep=1)
    for row, item in enumerate(items):
        spans = runner.adapter.image_spans(batch.input_ids[row], len(item.images))
        assert np.all(span_mass(attentions, row, -1, [6], spans) == 0)
        assert np.all(span_mass(attentions, row, -1, [5, 7], spans) > 0)


def test_default_lambda_among_capturable_layers() -> None:
    # Gemma 3 layouts: 5 sliding layers of every 6
    assert default_layers(26, attention_layers=[5, 11, 17, 23]) == (17, 23)
    assert default_layers(12, attention_layers=[5, 11]) == (5, 11)  # 7..11 has one: the last K
    assert default_layers(6, attention_layers=[5]) == (5,)
    assert default_layers(8, attention_layers=range(8)) == default_layers(8)
    with pytest.raises(ValueError):
        default_layers(4, attention_layers=[4])


def test_pixel_budgets_bound_the_image_tokens() -> None:
    """Idefics3 / SmolVLM: tiles per side; Mistral 3: the longest edge."""
    wide = Image.new("RGB", (256, 128), (90, 20, 20))

    def tokens(runner: Runner) -> int:
        return runner.forward([RetrievalItem("q", [wide])]).prompt_tokens[0]

    for family in ("idefics3", "smolvlm"):
        runner = tiny_runner(family)
        split = tokens(runner)  # 2 x 1 tiles of 32 pixels + the global image
        line = ADAPTERS[family].set_pixel_budget(runner.processor, 32 * 32 * 2, None)
        assert "1 tiles" in line and tokens(runner) < split  # one tile: the global image only
    runner = tiny_runner("mistral3")
    full = tokens(runner)  # longest edge 32: 4 x 2 cells of 8 pixels
    line = Mistral3Adapter.set_pixel_budget(runner.processor, 16 * 16, None)
    assert "longest edge 16" in line and "4 image tokens" in line
    assert full - tokens(runner) == (4 * 2 + 2) - (2 * 1 + 1)


@pytest.mark.slow
def test_lad_serve_serves_gemma3_from_its_checkpoint_directory(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """`LAD_MODEL=<dir> lad serve`: the family comes from config.json; a vanilla request
    and an attention readout (attn_raw) answer over HTTP with normalised probabilities.
    One family (the hybrid one): the others load through the same ``load_runner``, tested
    above, and a service start costs a minute on a busy CPU."""
    import httpx

    from tests.api.helpers import b64
    from tests.live import LiveService

    family = "gemma3"
    directory = tmp_path_factory.mktemp(family)
    model, processor = build_tiny(family)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    images = [b64(image) for image in random_images(3, seed=11, sizes=[(48, 48), (20, 50)])]
    env = {"LAD_MODEL": str(directory), "LAD_STORE_URL": "memory://"}
    workdir = directory.parent / f"{family}-serve"
    workdir.mkdir(exist_ok=True)
    with LiveService(workdir, env) as service:
        for method in ("vanilla", "attn_raw"):
            body = {"query": "a red square", "images": images, "method": method}
            answer = httpx.post(f"{service.url}/v1/retrieve", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
            result = answer.json()
            assert result["model"] == directory.name and len(result["probabilities"]) == 3
            assert sum(result["probabilities"]) == pytest.approx(1.0, abs=1e-6)
        assert f"model type {family} ({ADAPTERS[family].__name__}, saved as" in service.log()


def test_gemma3_capture_path_keeps_the_bidirectional_image_mask() -> None:
    """The capture path's forward is SDPA's, bit for bit, with the image tokens' bidirectional
    mask in effect (dropping ``token_type_ids`` changes the logits), so capture == eager
    above is checked on the model as it really attends."""
    runner = tiny_runner("gemma3")
    kwargs = runner.adapter.prompt_kwargs(runner.process(mixed_items()))
    model = runner.model
    with torch.inference_mode():
        captured = model(**kwargs, logits_to_keep=1).logits
        model.set_attn_implementation(runner.adapter.attn_implementation("sdpa", "sdpa"))
        sdpa = model(**kwargs, logits_to_keep=1).logits
        causal_only = {k: v for k, v in kwargs.items() if k != "token_type_ids"}
        causal = model(**causal_only, logits_to_keep=1).logits
    assert torch.equal(captured, sdpa)
    assert float((sdpa - causal).abs().max()) > 1e-3
