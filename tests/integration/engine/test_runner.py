"""Runner: one prompt forward per batch, restricted label scores, batching, fingerprint, loader."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from transformers import BertConfig

from app.engine.adapter import PromptBatch
from app.engine.identity import config_hash
from app.engine.interface import ForwardResult, RetrievalItem
from app.engine.label_scoring import LabelTrie, chain_path
from app.engine.labels import prompt_hash, resolve_labels
from app.engine.runner import Runner
from app.models.loader import checkpoint_dtype, load_runner, make_runner, resolve_dtype
from app.models.registry import UnsupportedModelError, adapter_for, supported_model_types
from lad_lab.testing.tiny_models import (
    FAMILIES,
    attention_layers,
    build_tiny,
    random_images,
    tiny_runner,
)
from tests.integration.engine.reference import brute_force_scores

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def runner(shared_runner) -> Runner:
    return shared_runner("qwen2_5_vl")


def _items() -> list[RetrievalItem]:
    images = random_images(12, seed=7, sizes=[(48, 48), (70, 40), (40, 64)])
    return [
        RetrievalItem("a small red boat", images[:4]),
        RetrievalItem("two birds on a wire", images[4:7]),
        RetrievalItem("snow", images[:12]),
    ]


def test_scores_are_restricted_log_probs(runner: Runner) -> None:
    result = runner.forward(_items())
    assert isinstance(result, ForwardResult)
    assert set(result.timings_ms) == {"process", "forward", "score"}
    assert all(v >= 0 for v in result.timings_ms.values())
    for item, s, a in zip(_items(), result.scores, result.attention, strict=True):
        n = len(item.images)
        assert s.shape == (n,) and a.shape == (len(runner.layers), n)
        assert abs(float(np.exp(s).sum()) - 1.0) < 1e-9
        assert np.all(a > 0)


def test_batch_equals_single_items(runner: Runner) -> None:
    items = _items()
    batched = runner.forward(items)
    for k, item in enumerate(items):
        single = runner.forward([item])
        np.testing.assert_allclose(single.scores[0], batched.scores[k], atol=1e-4, rtol=0)
        np.testing.assert_allclose(single.attention[0], batched.attention[k], atol=1e-4, rtol=0)


def test_exactly_one_prompt_forward_and_no_generate(
    runner: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict] = []

    def record(_module: torch.nn.Module, _args: tuple, kwargs: dict) -> None:
        # the images reach the model as pixels, or (repeated images) as their encoder outputs
        images = kwargs.get("pixel_values") is not None or bool(kwargs.get("mm_encoder_outputs"))
        calls.append({"pixels": images, "cache": kwargs.get("use_cache")})

    def no_generate(*_a: object, **_k: object) -> None:
        raise AssertionError("generate() must not be called on the scoring path")

    monkeypatch.setattr(runner.model, "generate", no_generate)
    handle = runner.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        runner.forward(_items()[:2])  # N = 4 and 3: single-token labels, no cached steps
        assert calls == [{"pixels": True, "cache": False}]
        calls.clear()
        # N = 12 in the batch: "1" vs "10".."12" (depth 1) folds into the same forward
        runner.forward(_items())
        assert calls == [{"pixels": True, "cache": False}]
        calls.clear()
        # roman N = 12 (real Qwen BPE): "V" -> {"II", "III", EOS} and "X" -> {"II", EOS}
        # branch at two nodes, off one chain: cached steps
        runner.forward(_items()[2:], labels="roman")
        assert [c["pixels"] for c in calls][:2] == [True, False]
        assert calls[0]["cache"] is True and len(calls) > 1
    finally:
        handle.remove()


def test_chain_path_decides_the_fold(runner: Runner) -> None:
    def trie(spec: str, n: int) -> LabelTrie:
        return runner.label_trie(resolve_labels(spec, n))

    one = trie("digits", 12).token_sequences[0]
    assert chain_path(trie("digits", 12)) == one  # root -> "1" -> {"0", "1", "2", EOS}
    assert chain_path(trie("digits", 9)) == ()
    assert chain_path(trie("words", 12)) == ()  # real BPE: every word has its own first token
    assert chain_path(trie("roman", 12)) is None  # "V" and "X" both branch at depth 1
    assert chain_path(trie("digits", 120)) is None
    deep = LabelTrie.build([(1,), (1, 2), (1, 3), (1, 2, 4), (1, 2, 5), (6,)], eos_id=9)
    assert chain_path(deep) == (1, 2)
    fork = LabelTrie.build([(1, 2, 4), (1, 2, 5), (1, 3, 4), (1, 3, 5)], eos_id=9)
    assert chain_path(fork) is None


def _mixed_batch(
    runner: Runner,
) -> tuple[list[RetrievalItem], list[str], list[LabelTrie], PromptBatch]:
    """Rows: N=12 digits, N=3 digits, N=12 roman numerals (each row its own scheme)."""
    items = [_items()[2], _items()[1], RetrievalItem("a quiet harbour", _items()[2].images)]
    specs = ["digits", "digits", "roman"]
    prompts = [runner.prompts([it], spec)[0] for it, spec in zip(items, specs, strict=True)]
    batch = runner.adapter.process(prompts, [list(it.images) for it in items])
    tries = [
        runner.label_trie(resolve_labels(spec, len(it.images)))
        for it, spec in zip(items, specs, strict=True)
    ]
    return items, specs, tries, batch.to(runner.device, runner.dtype)


def test_mixed_batch_falls_back_to_cached_steps(runner: Runner) -> None:
    items, specs, tries, batch = _mixed_batch(runner)
    assert [chain_path(t) is None for t in tries] == [False, False, True]
    caches: list[object] = []
    handle = runner.model.register_forward_pre_hook(
        lambda _m, _a, kw: caches.append(kw.get("use_cache")), with_kwargs=True
    )
    try:
        result = runner._forward_processed(batch, tries)
    finally:
        handle.remove()
    assert caches[0] is True and len(caches) > 1  # prompt forward, then cached steps
    for item, spec, scores in zip(items, specs, result.scores, strict=True):
        labels = resolve_labels(spec, len(item.images))
        expected = brute_force_scores(runner, item, labels)
        np.testing.assert_allclose(scores, expected, atol=1e-5, rtol=0)
    # the two digit rows alone fold, and agree with the fallback batch
    folded = runner._forward_processed(runner.process(items[:2]), tries[:2])
    for k in range(2):
        np.testing.assert_allclose(folded.scores[k], result.scores[k], atol=1e-5, rtol=0)
        np.testing.assert_allclose(folded.attention[k], result.attention[k], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_folded_equals_cached_steps(family: str) -> None:
    runner = tiny_runner(family, seed=3, layers=attention_layers(family))
    items = _items()  # N = 4, 3, 12: rows need 0, 0 and 1 chain tokens
    calls: list[object] = []
    handle = runner.model.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(kw.get("use_cache")), with_kwargs=True
    )
    try:
        folded = runner.forward(items)
        assert calls == [False]  # prompt + "1" in one forward
        runner._fold_chains = False
        cached = runner.forward(items)
        assert calls[1] is True and len(calls) == 3  # prompt forward + one cached step
    finally:
        handle.remove()
    for x, y in zip(
        folded.scores + folded.attention, cached.scores + cached.attention, strict=True
    ):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_trie_equals_brute_force_for_twelve_digits(family: str, shared_runner) -> None:
    runner = shared_runner(family, seed=1)
    items = _items()
    result = runner.forward(items)  # batched, left-padded, N = 4, 3, 12
    for item, scores in zip(items, result.scores, strict=True):
        labels = resolve_labels("digits", len(item.images))
        expected = brute_force_scores(runner, item, labels)
        np.testing.assert_allclose(scores, expected, atol=1e-5, rtol=0)


def test_roman_numerals_use_cached_steps(runner: Runner) -> None:
    item = _items()[2]
    assert chain_path(runner.label_trie(resolve_labels("roman", 12))) is None
    result = runner.forward([item], labels="roman")
    expected = brute_force_scores(runner, item, resolve_labels("roman", 12))
    np.testing.assert_allclose(result.scores[0], expected, atol=1e-5, rtol=0)


def test_image_spans_hold_each_image(runner: Runner) -> None:
    batch = runner.process(_items())
    tok = runner.adapter.tokenizer
    start, end, pad = (
        tok.convert_tokens_to_ids(t)
        for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
    )
    merge = runner.processor.image_processor.merge_size
    grids = iter(batch.inputs["image_grid_thw"].tolist())
    for row, n in enumerate(batch.n_images):
        spans = runner.adapter.image_spans(batch.input_ids[row], n)
        assert len(spans) == n
        for s, e in spans:
            ids = batch.input_ids[row, s:e].tolist()
            t, h, w = next(grids)
            assert ids[0] == start and ids[-1] == end
            assert ids[1:-1] == [pad] * (t * h * w // merge**2)


def test_fingerprint_fields(runner: Runner, shared_runner) -> None:
    fp = runner.fingerprint("digits", 4)
    assert fp.model_dump() == {
        "model_id": "tiny-qwen2_5_vl",
        "model_revision": None,
        "dtype": "float32",
        "attention_backend": "lad_capture(sdpa)",
        "capture": "sdpa",
        "prompt_hash": prompt_hash("vanilla", runner.adapter.chat_template()),
        "label_scheme": "digits",
        "n": 4,
        "config_hash": config_hash(runner.model.config),
        "weights_hash": runner.weights_hash,
    }
    assert runner.fingerprint("upper", 4).label_scheme == "upper"
    assert runner.fingerprint("digits", 5).n == 5
    other = shared_runner("qwen2_5_vl", prompt_variant="instruction")
    assert other.fingerprint("digits", 4).prompt_hash != fp.prompt_hash
    with pytest.raises(ValidationError):  # frozen
        fp.n = 3  # type: ignore[misc]
    assert runner.layers == (2, 3) and runner.num_layers == 4
    assert runner.device.type == "cpu" and runner.dtype == torch.float32


def test_loader_round_trip(tmp_path: Path) -> None:
    # the byte-level vocabulary: this is about weights, Λ, dtype and the capture surviving
    # save -> load_runner; reading the real 151k-token tokenizer.json back costs ~20 s on a
    # busy CPU, and tests/integration/models/test_loading.py loads that one already
    model, processor = build_tiny("qwen2_5_vl", seed=2, vocab="bytes")
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    in_memory = make_runner(model, processor, layers=(1, 3))
    loaded = load_runner(str(tmp_path), device="cpu", dtype="auto", layers=(1, 3), threads=1)
    assert loaded.dtype == torch.float32 and loaded.model_id == tmp_path.name  # served name
    assert loaded.weights_hash == in_memory.weights_hash  # the same weights, saved and read
    assert loaded.attention_backend == "lad_capture"
    items = _items()
    a, b = in_memory.forward(items), loaded.forward(items)
    for x, y in zip(a.scores + a.attention, b.scores + b.attention, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6, rtol=0)
    assert (
        loaded.fingerprint("digits", 4).prompt_hash
        == in_memory.fingerprint("digits", 4).prompt_hash
    )


def test_registry_and_dtype_errors() -> None:
    assert {"qwen2_vl", "qwen2_5_vl"} <= set(supported_model_types())
    with pytest.raises(UnsupportedModelError, match="qwen2_5_vl"):
        adapter_for(BertConfig())
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cuda"), torch.float16) == torch.float16
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    # a bfloat16 checkpoint runs in bfloat16 only on a CPU that multiplies it natively
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    assert resolve_dtype("auto", cpu, bf16, fast_bf16_cpu=True) == bf16
    assert resolve_dtype("auto", cpu, bf16, fast_bf16_cpu=False) == torch.float32
    assert resolve_dtype("auto", cpu, torch.float16, fast_bf16_cpu=True) == torch.float32
    assert resolve_dtype("float32", cpu, bf16, fast_bf16_cpu=True) == torch.float32
    # the saved dtype: the config's own, else its text model's (composite configs)
    assert checkpoint_dtype(SimpleNamespace(dtype="bfloat16")) == bf16
    assert checkpoint_dtype(SimpleNamespace(text_config=SimpleNamespace(torch_dtype=bf16))) == bf16
    assert checkpoint_dtype(SimpleNamespace()) is None
    with pytest.raises(ValueError):
        resolve_dtype("int3")
    with pytest.raises(ValueError):
        tiny_runner("qwen2_5_vl", layers=(9,))


def test_forward_reports_prompt_tokens_per_item(runner: Runner) -> None:
    items = _items()
    out = runner.forward(items)
    batch = runner.process(items)
    assert out.prompt_tokens == batch.attention_mask.sum(-1).tolist()
    assert out.prompt_tokens[2] > out.prompt_tokens[1]  # 12 images vs 3


@pytest.mark.parametrize("labels", ["digits", "words"])
def test_plain_forward_runs_the_same_forward_without_capture(runner: Runner, labels) -> None:
    """The shadow measurement's forward: same logits as the captured forward (capture only
    reads a row), nothing captured, both stages timed."""
    from app.engine import attention

    items = _items()[:2]
    seen: list[object] = []
    original = runner.model.forward

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        seen.append((attention._ACTIVE.get(), out.logits[:, -1].clone()))
        return out

    runner.model.forward = spy
    try:
        timings = runner.plain_forward_ms(items, labels)
        plain_session, plain_logits = seen[-1]
        runner.forward(items, labels)
    finally:
        del runner.model.forward
    assert plain_session is None and set(timings) == {"process", "forward"}
    assert timings["forward"] > 0 and timings["process"] > 0
    captured = [s for s, _ in seen[1:] if s is not None]
    assert captured, "the live forward captures"
    torch.testing.assert_close(plain_logits, seen[1][1])
