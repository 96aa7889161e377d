"""LLaVA-OneVision-1.5 through its adapter, on a stand-in (Qwen2.5-VL classes behind the
published OV-1.5 config values, processor layout and forward signature; the real weights
and code cannot be had here), served by the eager-hook capture and loaded as remote code
only with LAD_TRUST_REMOTE_CODE."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers.dynamic_module_utils

from app.engine.attention import EAGER_HOOK_CAPTURE, eager_attentions, span_mass
from app.engine.interface import RetrievalItem
from app.models.llava_onevision1_5 import LlavaOneVision15Adapter
from app.models.loader import ModelLoadError, load_runner
from lad_lab.eval.generate import generate_answers
from lad_lab.testing.families.llava_onevision1_5 import (
    StandInForConditionalGeneration,
    save_remote_code_checkpoint,
)
from lad_lab.testing.tiny_models import random_images, tiny_runner

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def runner():
    return tiny_runner("llavaonevision1_5")


def _items() -> list[RetrievalItem]:
    images = random_images(8, seed=6, sizes=[(48, 48), (64, 40), (40, 72)])
    return [RetrievalItem("a red square", images[:3]), RetrievalItem("two dogs", images[3:8])]


def test_the_stand_in_is_served_by_the_eager_hook(runner) -> None:
    adapter = runner.adapter
    assert isinstance(adapter, LlavaOneVision15Adapter)
    assert runner.capture == EAGER_HOOK_CAPTURE and runner.attention_backend == "eager"
    assert runner.layers == (7, 8, 9, 10, 11)  # 12 layers: |Λ| = 5 > K = 2
    fingerprint = runner.fingerprint("digits", 3)
    assert (fingerprint.capture, fingerprint.attention_backend) == ("eager_hook", "eager(eager)")
    items = _items()
    batch = runner.process(items)
    kwargs = adapter.prompt_kwargs(batch)
    assert "mm_token_type_ids" in batch.inputs and "mm_token_type_ids" not in kwargs
    assert kwargs["position_ids"].shape == batch.input_ids.shape  # 1-D text positions
    with torch.inference_mode():
        assert runner.model(**kwargs, logits_to_keep=2).logits.shape[1] == 2  # cut before lm_head
    prompt = runner.prompts(items[:1])[0]
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.count("<|vision_start|><|image_pad|><|vision_end|>") == 3
    assert prompt.endswith("Answer: <|im_end|>\n<|im_start|>assistant\n")

    result = runner.forward(items)
    attentions = eager_attentions(runner.model, adapter, batch, logits_to_keep=1)
    for row, n in enumerate(batch.n_images):
        spans = adapter.image_spans(batch.input_ids[row], n)
        assert all(batch.input_ids[row, s] != batch.input_ids[row, e - 1] for s, e in spans)
        expected = span_mass(attentions, row, -1, runner.layers, spans)
        np.testing.assert_allclose(result.attention[row], expected, atol=1e-5, rtol=0)
    for labels in ("digits", "words"):
        together = runner.forward(items, labels)
        for row, item in enumerate(items):
            alone = runner.forward([item], labels)
            np.testing.assert_allclose(together.scores[row], alone.scores[0], atol=1e-5, rtol=0)
            np.testing.assert_allclose(together.attention[row], alone.attention[0], atol=1e-5)
            assert abs(np.exp(together.scores[row]).sum() - 1) < 1e-9


def test_remote_code_loads_only_with_trust_remote_code(
    runner, tmp_path, monkeypatch, caplog
) -> None:
    monkeypatch.setattr(
        transformers.dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules")
    )
    checkpoint = save_remote_code_checkpoint(tmp_path / "ov15")
    with pytest.raises(ModelLoadError, match="LAD_TRUST_REMOTE_CODE=true"):
        load_runner(str(checkpoint), device="cpu")
    with caplog.at_level("WARNING", logger="lad.model"):
        loaded = load_runner(str(checkpoint), device="cpu", revision=None, trust_remote_code=True)
    warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(str(checkpoint) in m and "revision" in m and "code" in m for m in warning)
    # resolved through the checkpoint's auto_map and Python files: transformers has no such class
    assert type(loaded.model) is StandInForConditionalGeneration
    assert isinstance(loaded.adapter, LlavaOneVision15Adapter)
    assert loaded.fingerprint("digits", 3).capture == EAGER_HOOK_CAPTURE
    a, b = runner.forward(_items()), loaded.forward(_items())
    for x, y in zip(a.scores + a.attention, b.scores + b.attention, strict=True):
        np.testing.assert_allclose(y, x, atol=1e-6, rtol=0)


def test_the_stand_in_generates_through_its_cache(runner) -> None:
    """transformers 5.24's ``generate`` passes the cache as ``cache``; the published forward
    names it ``past_key_values`` (and takes no ``**kwargs``): the adapter hands it over, so
    decoding with the cache gives the tokens that decoding without one does."""
    items = _items()[:1]
    (answer,) = generate_answers(runner, items, max_new_tokens=4)
    assert 1 <= answer.forward_passes <= 4
    kwargs = runner.adapter.prompt_kwargs(runner.process(items))
    kwargs.pop("position_ids")  # from the cache, as the published forward makes them
    settings = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False}
    with torch.inference_mode():
        cached = runner.model.generate(**kwargs, **settings)
        plain = runner.model.generate(**kwargs, **settings, use_cache=False)
    assert cached.shape[1] == kwargs["input_ids"].shape[1] + 4
    assert torch.equal(cached, plain)
