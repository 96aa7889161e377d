"""Usable CPUs (affinity, cgroup v2/v1 quota), the default torch threads, the CPU's bfloat16
flags and OpenMP's wait policy, read from fake /proc and /sys files."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine import hardware, openmp


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_affinity_counts_the_mask() -> None:
    assert hardware.affinity_cpus(lambda pid: {0, 3, 5}) == 3
    assert hardware.affinity_cpus(lambda pid: set()) == 1


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("max 100000\n", None), ("150000 100000\n", 1.5), ("200000 100000", 2.0), ("junk", None)],
)
def test_cgroup_v2_cpu_max(text: str, cpus: float | None) -> None:
    assert hardware.parse_cgroup_v2_max(text) == cpus


def test_cgroup_v1_quota() -> None:
    assert hardware.parse_cgroup_v1("-1\n", "100000\n") is None
    assert hardware.parse_cgroup_v1("50000\n", "100000\n") == 0.5
    assert hardware.parse_cgroup_v1("x", "100000") is None


def test_cgroup_v2_tightest_limit_along_the_path(tmp_path: Path) -> None:
    proc = tmp_path / "proc_self_cgroup"
    _write(proc, "0::/outer/inner\n")
    root = tmp_path / "cgroup"
    _write(root / "outer" / "cpu.max", "100000 100000\n")  # 1 CPU for the parent
    _write(root / "outer" / "inner" / "cpu.max", "max 100000\n")
    assert hardware.cgroup_cpu_limit(root, proc) == 1.0


def test_cgroup_v1_quota_of_the_cpu_controller(tmp_path: Path) -> None:
    proc = tmp_path / "proc_self_cgroup"
    _write(proc, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    root = tmp_path / "cgroup"
    folder = root / "cpu,cpuacct" / "docker" / "abc"
    _write(folder / "cpu.cfs_quota_us", "250000\n")
    _write(folder / "cpu.cfs_period_us", "100000\n")
    assert hardware.cgroup_cpu_limit(root, proc) == 2.5


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    assert hardware.cgroup_cpu_limit(tmp_path / "none", tmp_path / "missing") is None


def test_usable_cpus_and_default_threads() -> None:
    assert hardware.usable_cpus(8, 2.5) == 3  # a quota of 2.5 CPUs runs 3 threads
    assert hardware.usable_cpus(2, 16.0) == 2
    assert hardware.usable_cpus(4, None, read_quota=False) == 4
    reserved = hardware.RESERVED_CPUS
    assert hardware.default_torch_threads(1) == 1
    assert hardware.default_torch_threads(16) == 16 - reserved


def test_torch_threads_setting() -> None:
    assert hardware.torch_threads(None, cpus=4) == 4 - hardware.RESERVED_CPUS  # unset
    assert hardware.torch_threads(0, cpus=4) is None  # 0: torch's own default
    assert hardware.torch_threads(2, cpus=4) == 2


def test_bf16_cpu_flags() -> None:
    amx = "processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n"
    avx512_bf16 = "flags\t: fpu avx512f avx512_bf16\n"
    plain = "flags\t: fpu sse2 avx2 avx512f\n"
    assert hardware.cpu_runs_bf16_fast(amx)
    assert hardware.cpu_runs_bf16_fast(avx512_bf16)
    assert not hardware.cpu_runs_bf16_fast(plain)
    assert not hardware.cpu_runs_bf16_fast("")


def test_openmp_wait_policy_set_only_when_unset() -> None:
    env: dict[str, str] = {}
    assert openmp.configure(env) == "PASSIVE"
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    mine = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert openmp.configure(mine) == "ACTIVE"
    assert mine == {"OMP_WAIT_POLICY": "ACTIVE"}
