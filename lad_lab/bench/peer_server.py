"""The peer side of ``lad bench peer``: a vLLM OpenAI-compatible server on the same checkpoint,
asked the question as a user would, and the resident memory of a process tree.

vLLM is never a dependency of the project: it runs from its own interpreter (``--peer-python``,
a separate venv; /work/shared/peer/README.md says how it was installed on the CPU machines)
or is reached at ``--peer-url``. Its answer is the argmax over the label tokens: the same
prompt text as ours (``app.engine.labels.prompt_text`` after the N images), ``max_tokens=1``,
``temperature=0``, ``allowed_token_ids`` = the labels' tokens and their ``logprobs``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from app.engine.labels import prompt_text

SHAPE_PREFIX = "shape:"
PEER_PROCESSOR_CLASS = "Qwen2_5_VLProcessor"
"""The processor class vLLM knows; the demo's copy names its own subclass."""


def prepare_checkpoint(model: str, width: int | None, cache: Path, dtype: str) -> Path:
    """A directory both servers load: the demo's (a copy whose processor class vLLM knows,
    weights linked) or ``shape:<name>`` built once at ``width`` and saved in ``dtype``."""
    if model.startswith(SHAPE_PREFIX):
        name = model.removeprefix(SHAPE_PREFIX)
        folder = cache / f"{name}_w{width or 'full'}_{dtype}"
        if not (folder / "config.json").is_file():
            import torch

            from lad_lab.testing.shapes import build_shape

            built, processor = build_shape(name, width=width, dtype=getattr(torch, dtype))
            tmp = folder.with_suffix(".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            built.save_pretrained(tmp)
            processor.save_pretrained(tmp)
            tmp.rename(folder)
        return _with_peer_processor(folder)
    if model != "demo":
        return _with_peer_processor(Path(model))
    from app.models.demo_model import DEMO_MODEL_DIR

    folder = cache / "demo"
    if not (folder / "config.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        for item in DEMO_MODEL_DIR.iterdir():
            if item.suffix == ".safetensors":
                (folder / item.name).unlink(missing_ok=True)
                (folder / item.name).symlink_to(item.resolve())
            elif item.is_file():
                shutil.copy2(item, folder / item.name)
    return _with_peer_processor(folder)


def _with_peer_processor(folder: Path) -> Path:
    """Rename the processor class in the saved configs to one vLLM loads (in place)."""
    for name in ("processor_config.json", "tokenizer_config.json", "preprocessor_config.json"):
        path = folder / name
        if not path.is_file() or path.is_symlink():
            continue
        data = json.loads(path.read_text())
        if data.get("processor_class", PEER_PROCESSOR_CLASS) != PEER_PROCESSOR_CLASS:
            data["processor_class"] = PEER_PROCESSOR_CLASS
            path.write_text(json.dumps(data, indent=2))
    return folder


def context_length(checkpoint: Path, cap: int = 2048) -> int:
    """vLLM's --max-model-len: ``cap`` (its KV cache is sized for it), or the checkpoint's
    own context where that is shorter (vLLM refuses a longer one; the demo's is 1024)."""
    config = json.loads((checkpoint / "config.json").read_text())
    own = config.get("text_config", {}).get("max_position_embeddings")
    own = own or config.get("max_position_embeddings")
    return min(cap, int(own)) if own else cap


def label_token_ids(checkpoint: Path, labels: list[str]) -> list[int]:
    """One token id per label (the tokenizer's own; a label of several tokens is refused)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    ids = []
    for label in labels:
        encoded = tokenizer.encode(label, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"label {label!r} is {len(encoded)} tokens, not one")
        ids.append(encoded[0])
    return ids


def chat_body(payload: dict, served_name: str, labels: list[str], token_ids: list[int]) -> dict:
    """The OpenAI chat request: N images then our prompt text, one token among the labels."""
    content: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": url}} for url in payload["images"]
    ]
    content.append({"type": "text", "text": prompt_text(payload["query"], labels)})
    return {
        "model": served_name,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1,
        "temperature": 0,
        "allowed_token_ids": token_ids,
        "logprobs": True,
        "top_logprobs": len(labels),
    }


def peer_answer(response: dict, labels: list[str]) -> int | None:
    """The 0-based index of the label the peer chose (None: no label)."""
    text = response["choices"][0]["message"]["content"].strip()
    return labels.index(text) if text in labels else None


class PeerServer:
    """vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``) from another
    interpreter, in its own session so that its workers stop with it; the log in a file."""

    def __init__(
        self,
        python: str,
        checkpoint: Path,
        port: int,
        *,
        shim: str | None,
        dtype: str,
        max_images: int,
        served_name: str,
        workdir: Path,
        extra: list[str] | None = None,
    ) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.served_name = served_name
        self.log_path = workdir / f"vllm-{port}.log"
        self.command = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(checkpoint),
            "--dtype",
            dtype,
            "--max-model-len",
            str(context_length(checkpoint)),
            "--limit-mm-per-prompt",
            json.dumps({"image": max_images, "video": 0}),
            "--served-model-name",
            served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *(extra or []),
        ]
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        if shim:
            self.env["PYTHONPATH"] = shim + os.pathsep + self.env.get("PYTHONPATH", "")
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s = float("nan")

    def start(self, timeout_s: float = 900.0) -> PeerServer:
        started = time.perf_counter()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        while True:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"vLLM exited {self.proc.returncode}:\n{tail}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2.0).status_code == 200:
                    self.startup_s = time.perf_counter() - started
                    return self
            except httpx.HTTPError:
                pass
            if time.perf_counter() - started > timeout_s:
                self.stop()
                raise RuntimeError(f"vLLM was not ready within {timeout_s} s ({self.log_path})")
            time.sleep(0.5)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to its own process group, SIGKILL after ``timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc/<pid>/stat's parent field."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def tree_rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants, in MiB (0 once it is gone)."""
    tree, total, todo = _children(), 0.0, [pid]
    while todo:
        here = todo.pop()
        todo += tree.get(here, [])
        try:
            for line in Path(f"/proc/{here}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024.0
        except OSError:
            continue
    return total


class TreePeak:
    """The peak of ``tree_rss_mib`` over a block, sampled every ``every_s``."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        self.pid, self.every_s, self.peak = pid, every_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_mib(self.pid))
            self._stop.wait(self.every_s)

    def __enter__(self) -> TreePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
