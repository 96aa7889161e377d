"""The generic adapter's processor probe: a processor that drops the prompt is refused."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from app.models.loader import ModelLoadError, load_runner
from app.models.processor_probe import drops_the_prompt
from lad_lab.testing.generic.processor import build_processor
from lad_lab.testing.generic.shrink import shrink
from lad_lab.testing.generic.tokens import placeholder_of
from lad_lab.testing.tiny_models import build_tiny


def _probe(model_type: str) -> bool:
    """The probe on the type's processor built in code, the prompt its image then a query."""
    config = CONFIG_MAPPING[model_type]()
    shrink(config)
    processor = build_processor(model_type, config)
    adapter = SimpleNamespace(
        processor=processor,
        tokenizer=processor.tokenizer,
        render=lambda n, text: placeholder_of(processor) * n + text,
    )
    return drops_the_prompt(adapter)


def test_a_processor_writing_its_own_prompts_is_named() -> None:
    assert _probe("shieldgemma2")  # one policy prompt per image, the text it is given dropped


def test_processors_that_keep_the_prompt_are_not() -> None:
    assert not _probe("llava")
    assert not _probe("paligemma")


def test_a_probe_that_cannot_run_names_nothing() -> None:
    def refuse(**_: object) -> None:
        raise RuntimeError("no")

    adapter = SimpleNamespace(processor=refuse, tokenizer=None, render=lambda n, text: text)
    assert not drops_the_prompt(adapter)


def test_the_load_path_refuses_it_in_one_line(tmp_path: Path) -> None:
    model, processor = build_tiny("shieldgemma2")
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=r"cannot serve .* prompts of its own"):
        load_runner(str(tmp_path), device="cpu")
