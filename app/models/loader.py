"""Load a model (hub name, local path or ``"demo"``), build its adapter, wrap it in a Runner.

This is where the family registry is consulted: the runner receives a built adapter.
The processor is loaded through the family adapter's ``load_processor``, which
falls back to rebuilding it from the saved tokenizer, image processor and chat
template when ``AutoProcessor`` cannot (e.g. no torchvision), so a saved
directory loads offline.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import huggingface_hub
import torch
import transformers
from transformers import AutoConfig

from app.engine import hardware
from app.engine.identity import served_name
from app.engine.runner import Runner
from app.models import hub_access
from app.models.demo_model import DEMO_MODEL_DIR
from app.models.registry import UnsupportedModelError, adapter_for

log = logging.getLogger("lad.model")

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> cuda when available, else cpu."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def checkpoint_dtype(config: Any) -> torch.dtype | None:
    """The dtype a checkpoint was saved in (its config's ``dtype`` / ``torch_dtype``, the
    text model's for a composite config), None where it says none."""
    for holder in (config, getattr(config, "text_config", None)):
        for attr in ("dtype", "torch_dtype"):
            value = getattr(holder, attr, None) if holder is not None else None
            if isinstance(value, torch.dtype):
                return value
            if isinstance(value, str) and value.removeprefix("torch.") in _DTYPES:
                return _DTYPES[value.removeprefix("torch.")]
    return None


def resolve_dtype(
    dtype: str | torch.dtype = "auto",
    device: torch.device | None = None,
    saved: torch.dtype | None = None,
    *,
    fast_bf16_cpu: bool | None = None,
) -> torch.dtype:
    """``"auto"``: the checkpoint's own dtype (``saved``) where the device runs it fast,
    float32 elsewhere. CUDA runs every half type fast (no saved dtype: bfloat16); a CPU
    only runs bfloat16 fast with AVX-512 BF16 or AMX (``fast_bf16_cpu``; None: read from
    /proc/cpuinfo), where it is 2.8x float32 (issue 42); float16 on a CPU is emulated."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device is not None and device.type == "cuda":
            return saved or torch.bfloat16
        if saved == torch.bfloat16:
            fast = hardware.cpu_runs_bf16_fast() if fast_bf16_cpu is None else fast_bf16_cpu
            if fast and (device is None or device.type == "cpu"):
                return torch.bfloat16
        return torch.float32
    try:
        return _DTYPES[dtype.removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use auto or one of {sorted(_DTYPES)}") from None


REMOTE_AUTO_CLASSES = ("AutoModelForImageTextToText", "AutoModelForCausalLM", "AutoModel")
"""Auto classes a remote-code checkpoint may map its model to (``auto_map``), in order."""


def _model_class(config: Any, trust_remote_code: bool = False) -> Any:
    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    auto_map = getattr(config, "auto_map", None) or {}
    if trust_remote_code:  # the checkpoint's own class, through the auto class it names
        for name in REMOTE_AUTO_CLASSES:
            if name in auto_map:
                return getattr(transformers, name)
    return transformers.AutoModelForImageTextToText


def make_runner(model: torch.nn.Module, processor: Any, **options: Any) -> Runner:
    """A Runner over an in-memory model and processor (tiny test models, training).

    The family adapter comes from the registry by ``model.config.model_type``; ``options``
    are the Runner's keyword arguments (model_id, revision, layers, prompt_variant, threads).
    """
    return Runner(adapter_for(model.config)(model, processor), **options)


class ModelLoadError(RuntimeError):
    """The model cannot be loaded, with what to do about it (printed without a traceback)."""


def quiet_progress_bars() -> None:
    """No tqdm bars from transformers or huggingface_hub: a service log gets plain lines."""
    from huggingface_hub.utils import disable_progress_bars

    transformers.utils.logging.disable_progress_bar()
    disable_progress_bars()


def _is_hub_name(source: str) -> bool:
    return not Path(source).exists() and source.count("/") <= 1 and not source.startswith(".")


def _unreachable(model: str, revision: str | None, cause: BaseException) -> ModelLoadError:
    """What to do when a hub name resolves neither from the cache nor from the hub."""
    offline = huggingface_hub.constants.HF_HUB_OFFLINE
    cache = huggingface_hub.constants.HF_HUB_CACHE
    at = f" at revision {revision!r}" if revision else ""
    why = (
        "HF_HUB_OFFLINE=1, so nothing is downloaded"
        if offline
        else "and the hub could not be reached"
    )
    return ModelLoadError(
        f"cannot load model {model!r}{at}: it is not a local directory and not in the Hugging "
        f"Face cache {cache} (HF_HOME={os.environ.get('HF_HOME', '(unset)')}), {why}.\n"
        f"  Fill the cache once, where the hub is reachable:  HF_HOME={Path(cache).parent} "
        f"hf download {model}{f' --revision {revision}' if revision else ''}\n"
        "  (in a container: mount that cache at HF_HOME; deploy/README.md 'Model weights'), "
        "or set LAD_MODEL to a local directory holding the model, or allow downloads with "
        f"HF_HUB_OFFLINE=0.\n  cause: {type(cause).__name__}: {str(cause).splitlines()[0]}"
    )


def load_runner(
    model: str,
    *,
    revision: str | None = None,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    layers: Sequence[int] | None = None,
    prompt_variant: str = "vanilla",
    threads: int | None = None,
    max_pixels: int | None = None,
    min_pixels: int | None = None,
    device_map: str | None = None,
    trust_remote_code: bool = False,
    served_model_name: str | None = None,
    encoder_cache_mb: float = 0,
) -> Runner:
    """Load ``model`` (hub name, local directory, or ``"demo"``) and wrap it in a Runner.

    The runner's ``model_id`` is the name it is served under: ``served_model_name``, else
    the hub id or the local directory's own name (``app.engine.identity.served_name``).

    ``threads`` sets torch's intra-op thread count before loading (None: leave it).
    ``max_pixels`` / ``min_pixels`` bound each image's pixels through the family's
    processor; ``device_map`` (e.g. "auto", needs the ``accelerate`` package) spreads the
    model over several devices instead of moving it to ``device``. ``trust_remote_code``
    runs the Python code a checkpoint ships (off by default; logged as a warning).
    ``encoder_cache_mb`` bounds the runner's encoder cache (0: off; the service passes
    LAD_ENCODER_CACHE_MB). Progress
    goes to the log as plain lines; nothing is written to HF_HOME. Raises ModelLoadError
    with what to do when the model cannot be found.
    """
    if threads is not None:
        torch.set_num_threads(int(threads))
    log.info(
        "torch intra-op threads: %d of %d usable CPUs (OMP_WAIT_POLICY=%s)",
        torch.get_num_threads(),
        hardware.usable_cpus(),
        os.environ.get("OMP_WAIT_POLICY", "unset"),
    )
    quiet_progress_bars()
    hub_access.log_once()
    started = time.perf_counter()
    source = str(DEMO_MODEL_DIR) if model == "demo" else model
    if model == "demo" and not (DEMO_MODEL_DIR / "config.json").is_file():
        raise ModelLoadError(f"the demo model is missing at {DEMO_MODEL_DIR}; run `lad demo train`")
    target = resolve_device(device)
    where = f"device_map={device_map!r}" if device_map else str(target)
    log.info("loading model %s (revision %s) on %s", model, revision or "default", where)
    if trust_remote_code:
        log.warning(
            "LAD_TRUST_REMOTE_CODE is on: model %s (revision %s) may run the Python code it ships",
            model,
            revision or "default, not pinned",
        )
    if _is_hub_name(source):  # known at once, not after 28 s of retries (app.models.hub_access)
        cause = hub_access.unavailable(source, revision)
        if cause is not None:
            raise _unreachable(model, revision, cause)
    remote = {"trust_remote_code": bool(trust_remote_code)}
    config = _pretrained(partial(AutoConfig.from_pretrained, **remote), model, source, revision)
    try:
        adapter_cls = adapter_for(config)  # fails early, listing supported types
    except UnsupportedModelError as exc:
        raise ModelLoadError(f"cannot serve model {model!r}: {exc}") from None
    torch_dtype = resolve_dtype(dtype, target, checkpoint_dtype(config))
    log.info(
        "model type %s (%s, saved as %s); loading weights as %s",
        config.model_type,
        adapter_cls.__name__,
        str(checkpoint_dtype(config)).removeprefix("torch."),
        str(torch_dtype).removeprefix("torch."),
    )
    loaded = _load_weights(config, model, source, revision, torch_dtype, device_map, remote)
    if device_map is None:
        loaded = loaded.to(target)
    loaded = loaded.eval()
    log.info(
        "weights loaded: %.1f M parameters in %.1f s",
        _millions(loaded),
        time.perf_counter() - started,
    )
    processor = _pretrained(partial(adapter_cls.load_processor, **remote), model, source, revision)
    if max_pixels is not None or min_pixels is not None:
        budget = adapter_cls.set_pixel_budget(processor, max_pixels, min_pixels)
        if budget is None:
            log.warning(
                "%s has no per-image pixel budget: LAD_MAX_PIXELS / LAD_MIN_PIXELS "
                "are ignored (docs/models.md)",
                adapter_cls.__name__,
            )
        else:
            log.info("image budget: %s", budget)
    try:
        adapter = adapter_cls(loaded, processor)
    except ValueError as exc:  # the generic adapter's refusals that need the processor
        if "cannot serve" not in str(exc):
            raise
        raise ModelLoadError(f"cannot serve model {model!r}: {exc}") from None
    runner = Runner(
        adapter,
        model_id=served_name(model, served_model_name),
        revision=revision,
        layers=layers,
        prompt_variant=prompt_variant,
        encoder_cache_mb=encoder_cache_mb,
    )
    log.info(
        "model %s loaded in %.1f s as %r (config %s, weights %s; layers Λ = %s)",
        model,
        time.perf_counter() - started,
        runner.model_id,
        runner.config_hash,
        runner.weights_hash,
        ",".join(str(x) for x in runner.layers),
    )
    return runner


def _millions(model: torch.nn.Module) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


def _pretrained(load: Any, model: str, source: str, revision: str | None) -> Any:
    """``load(source, revision=...)``, with a hub name that cannot be resolved explained,
    and a checkpoint whose own code is refused or does not import."""
    try:
        return load(source, revision=revision)
    except OSError as exc:
        if _is_hub_name(source):
            raise _unreachable(model, revision, exc) from None
        raise ModelLoadError(f"cannot load model {model!r} from {source}: {exc}") from None
    except ImportError as exc:  # remote code written against another transformers
        raise ModelLoadError(
            f"the code shipped with model {model!r} does not import with transformers "
            f"{transformers.__version__}: {exc}"
        ) from None
    except ValueError as exc:
        if "trust_remote_code" not in str(exc):
            raise
        raise ModelLoadError(
            f"model {model!r} needs the Python code it ships: set LAD_TRUST_REMOTE_CODE=true "
            "to run it (only for checkpoints you trust; docs/models.md)"
        ) from None


def _load_weights(
    config: Any,
    model: str,
    source: str,
    revision: str | None,
    torch_dtype: torch.dtype,
    device_map: str | None,
    remote: dict[str, bool],
) -> torch.nn.Module:
    # no attn_implementation: transformers' own choice, SDPA for each (sub)model that has it
    # and eager for one that has not (``_supports_sdpa = False``, e.g. a VQ image
    # tokenizer), where asking SDPA of all would refuse the model; the text model is put on
    # the capture path after loading either way
    options: dict[str, Any] = {
        "revision": revision,
        "dtype": torch_dtype,
        **remote,
    }
    if device_map is not None:
        if importlib.util.find_spec("accelerate") is None:
            raise ModelLoadError(
                f"LAD_DEVICE_MAP={device_map!r} needs the accelerate package: "
                "pip install accelerate"
            )
        options["device_map"] = device_map
    model_class = _model_class(config, remote["trust_remote_code"])
    return _pretrained(
        lambda src, revision: model_class.from_pretrained(src, **options),
        model,
        source,
        revision,
    )
