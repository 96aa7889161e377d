"""What this machine gives the model: usable CPUs and the default torch thread count.

Why: torch's default takes every core the machine reports, so under load its threads fight
the HTTP loop, image decode and anything else on the machine (issue 42: 0.14-0.22x vLLM's
requests/s on 2 cores). vLLM's CPU worker binds to all cores but one and leaves that one to
its server; the default here does the same, from the CPUs this process may actually run on
(its affinity mask and its cgroup's CPU quota, as a container limits it), not the machine's.

Nothing here imports torch: the CPU facts are read from /proc and /sys so that they can be
computed (and tested) before the model loads.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
CPUINFO = Path("/proc/cpuinfo")
RESERVED_CPUS = 1
"""CPUs the default leaves to the HTTP loop and image decode (vLLM's CPU worker leaves one to
its server). The one-line decision `lad bench peer --no-peer --threads auto,0,2,1` settles
(bench/results/threads_*.json: the default must not lose to one thread by more than 10 %)."""
FAST_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""/proc/cpuinfo flags of CPUs that run bfloat16 matrix products natively (AVX-512 BF16,
AMX): there bfloat16 is faster than float32 (2.8x on this project's AMX machine, issue 42);
elsewhere torch emulates it and it is slower."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def affinity_cpus(getaffinity: Callable[[int], set[int]] | None = None) -> int:
    """CPUs this process may run on (its affinity mask; os.cpu_count() where there is none)."""
    get = getaffinity or getattr(os, "sched_getaffinity", None)
    if get is None:
        return os.cpu_count() or 1
    return max(1, len(get(0)))


def parse_cgroup_v2_max(text: str) -> float | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` line (``"max 100000"``: None, no limit;
    ``"150000 100000"``: 1.5)."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cgroup_v1(quota_text: str, period_text: str) -> float | None:
    """CPUs allowed by cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: no limit)."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _cgroup_paths(proc_self_cgroup: str) -> tuple[str | None, str | None]:
    """This process's (v2 unified path, v1 cpu controller path) from /proc/self/cgroup."""
    v2 = v1 = None
    for line in proc_self_cgroup.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_self: Path = PROC_SELF_CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (None: no quota). Reads v2's
    ``cpu.max`` along the process's own cgroup path up to the root (the tightest wins),
    else v1's CFS quota; inside a container the namespace root is the container's group."""
    v2_path, v1_path = _cgroup_paths(_read(proc_self) or "")
    limits: list[float] = []
    if v2_path is not None:
        root = root.resolve()
        here = (root / v2_path.lstrip("/")).resolve()
        for folder in (here, *here.parents) if here.is_relative_to(root) else (root,):
            text = _read(folder / "cpu.max")
            if text is not None and (limit := parse_cgroup_v2_max(text)) is not None:
                limits.append(limit)
            if folder == root:
                break
    if not limits:
        for base in (root / "cpu", root / "cpu,cpuacct"):
            for folder in ((base / v1_path.lstrip("/")) if v1_path else base, base):
                limit = parse_cgroup_v1(
                    _read(folder / "cpu.cfs_quota_us") or "",
                    _read(folder / "cpu.cfs_period_us") or "",
                )
                if limit is not None:
                    limits.append(limit)
    return min(limits) if limits else None


def usable_cpus(
    affinity: int | None = None, quota: float | None = None, *, read_quota: bool = True
) -> int:
    """CPUs the model may use: the affinity mask, capped by the cgroup quota (rounded up:
    a quota of 1.5 CPUs runs two threads for 75 % of the time each)."""
    cpus = affinity if affinity is not None else affinity_cpus()
    limit = quota if quota is not None or not read_quota else cgroup_cpu_limit()
    if limit is not None:
        cpus = min(cpus, max(1, math.ceil(limit)))
    return max(1, cpus)


def default_torch_threads(cpus: int | None = None) -> int:
    """The default intra-op thread count: usable CPUs - RESERVED_CPUS, at least 1."""
    return max(1, (usable_cpus() if cpus is None else cpus) - RESERVED_CPUS)


def torch_threads(setting: int | None, cpus: int | None = None) -> int | None:
    """The thread count to give torch for ``LAD_TORCH_THREADS``: unset -> the default above;
    0 -> None (leave torch's own default: every core); N -> N."""
    if setting is None:
        return default_torch_threads(cpus)
    if setting == 0:
        return None
    return int(setting)


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    text = _read(CPUINFO) if cpuinfo is None else cpuinfo
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_runs_bf16_fast(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX)."""
    return bool(cpu_flags(cpuinfo) & FAST_BF16_CPU_FLAGS)
