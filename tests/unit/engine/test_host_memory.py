"""The C heap's policies (app.engine.host_memory), each in a fresh interpreter: glibc's
settings hold for the whole process, and an arena is chosen at a thread's first allocation."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine import host_memory

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import ctypes, json, os, resource, sys, threading
from app.engine import host_memory

applied = host_memory.apply(sys.argv[1])
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
faults = []

def forwards():  # on a thread, as the model worker runs: a 256 MiB block, every page written
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(2**28)
        ctypes.memset(block, 1, 2**28)
        libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

def rss_mib():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

worker = threading.Thread(target=forwards)
worker.start()
worker.join()
kept = rss_mib()
released = host_memory.release_free_memory()
print(json.dumps({"applied": applied, "faults": faults, "kept_mib": kept,
                  "released": released, "after_release_mib": rss_mib()}))
"""

glibc_only = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the policies are glibc's mallopt settings"
)


def _probe(policy: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, policy],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_retain_reuses_freed_pages_where_map_apart_faults_them_in_again() -> None:
    retain, apart = _probe("retain"), _probe("map_apart")
    assert retain["applied"] and apart["applied"]
    pages = 2**28 // 4096  # what one block faults in (glibc asks for no huge pages)
    # map_apart: the block is unmapped when freed, so every block faults again
    assert min(apart["faults"][1:]) > pages // 8
    # retain: the first block's pages serve the next three
    assert max(retain["faults"][1:]) < min(apart["faults"][1:]) // 20


@glibc_only
def test_release_gives_what_retain_kept_back_to_the_os() -> None:
    retain = _probe("retain")
    assert retain["released"]
    assert retain["kept_mib"] - retain["after_release_mib"] > 200  # the 256 MiB block's pages


def test_the_setting_names_the_policy_and_unknown_policies_are_refused() -> None:
    assert host_memory.policy_for(1.0) == "retain"
    assert host_memory.policy_for(0) == "map_apart"
    with pytest.raises(ValueError, match="one of retain, map_apart, glibc"):
        host_memory.apply("jemalloc")
