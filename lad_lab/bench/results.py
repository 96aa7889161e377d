"""Where benchmark results go (one JSON record per run, under bench/results/ by default), and
the facts about this process and machine that records state (device, resident memory)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from app.engine.host_memory import rss_bytes as rss_bytes  # one definition, for the lab

MIB = 2**20


def write_record(path: str | Path, record: dict[str, Any]) -> Path:
    """Write ``record`` as indented JSON (parent folders created) and say where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    print(f"wrote {out}")
    return out


def device_name(device: str) -> str:
    """The accelerator's own name (e.g. "NVIDIA H200") for a cuda / auto device with CUDA
    present, else the CPU architecture: what a record names its machine by."""
    import torch

    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.machine()})"


def conditions(load_start: float) -> dict[str, Any]:
    """What a service record states about where it ran: CPUs, device, the load average from
    ``load_start`` (taken when the bench began) to now."""
    device = os.environ.get("LAD_DEVICE", "auto")
    return {
        "cpu_count": os.cpu_count(),
        "device": device,
        "device_name": device_name(device),
        "load_avg_1min": {"start": load_start, "end": os.getloadavg()[0]},
    }
