"""What the process's C heap (glibc malloc) does with the memory a forward frees.

A CPU forward of a real-size model allocates and frees tensors of tens to hundreds of MiB.
glibc serves each block above its mmap threshold from a mapping of its own and unmaps it
when it is freed, so the next forward faults the same memory in again, 4 KiB at a time: on
shape:qwen2_5_vl-3b (66 images in six rows) the service's former setting, every block of
1 MiB or more mapped apart, spent a third of a forward's CPU time in the kernel on 8 M page
faults, and retention makes the forward 0.7x as long (``lad bench host-memory``;
docs/benchmarks.md "Host memory").

Two policies, chosen once per process before its threads start:

* :func:`keep_freed_memory` (``LAD_HOST_MEMORY_RETAIN_S`` > 0, the default): every block from
  one heap (no per-block mappings, one arena, no automatic trim), so one forward's freed
  pages serve the next; :func:`release_free_memory` (``malloc_trim``) gives every free page
  back, which the model worker calls once it has been idle that many seconds, and the
  decode after a large body or image. A worker under steady traffic is never idle, so
  :class:`ReleaseSchedule` also releases after a batch once ``LAD_HOST_MEMORY_TRIM_EVERY_S``
  and 8 batches have passed since the last release, or at once when resident memory rose
  ``LAD_HOST_MEMORY_TRIM_ABOVE_MB`` above what it was after that release: what a burst
  leaves held is returned within seconds whether or not traffic stops.
* :func:`map_blocks_apart` (``LAD_HOST_MEMORY_RETAIN_S=0``): blocks from a size on are mapped
  apart and go back the moment they are freed, at the cost of those page faults.

Elsewhere than glibc (musl, macOS) nothing is changed and the functions return False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_INT_MAX = 2**31 - 1

LARGE_BLOCK_BYTES = 1 << 20
"""Without retention, blocks from this size on are mapped apart (returned when freed)."""

_KEEP = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _INT_MAX), (_M_ARENA_MAX, 1))
"""No block mapped apart (it would be unmapped on free), the heap's top never trimmed by
malloc itself, and one arena: a thread arena serves blocks above its 64 MiB heap size from
mappings whatever ``M_MMAP_MAX`` says, and the model worker is a thread."""


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        libc = None
    if libc is None or not all(hasattr(libc, f) for f in ("mallopt", "malloc_trim")):
        log.info("not glibc: the C heap is left as it is")
        return None
    return libc


def keep_freed_memory() -> bool:
    """Serve every block from one heap that malloc never trims by itself; True when glibc
    took every setting. Call before threads start (an arena is chosen at a thread's first
    allocation)."""
    libc = _glibc()
    return libc is not None and all(libc.mallopt(p, v) == 1 for p, v in _KEEP)


def map_blocks_apart(threshold_bytes: int = LARGE_BLOCK_BYTES) -> bool:
    """Map every block of ``threshold_bytes`` or more apart, returned to the OS when freed
    (a fixed threshold: glibc otherwise raises it to the largest block freed, up to 32 MiB,
    and a process that once decoded big images keeps hundreds of MiB in its arenas)."""
    libc = _glibc()
    return libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes) == 1


def release_free_memory() -> bool:
    """Give the free pages of every arena back to the OS (``malloc_trim(0)``); True when
    glibc released some."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """This process's resident set now (Linux ``/proc/self/statm``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * PAGE_BYTES
    except OSError:
        return 0


RELEASE_MIN_BATCHES = 8
"""Batches between two scheduled releases at least: at most one forward in this many pays
the page faults a release costs, however long the forwards take."""


class ReleaseSchedule:
    """When the model worker gives the memory its forwards freed back to the OS while busy.

    Retention pays off because one forward's freed pages serve the next; releasing after
    every batch would fault them in again each time. So under traffic the release is rare:
    after a batch once ``every_s`` seconds and ``min_batches`` batches have passed since the
    last release (the forward after a release faults its pages in again: at most one in
    ``min_batches`` pays), or at once when resident memory stands ``above_bytes`` above
    where the last release left it (a burst of large requests is not held until the next
    period; set it above one forward's working set, or every batch releases).
    :meth:`release` is the idle release too, so both paths restart the same period. Runs on
    the worker thread only (no lock)."""

    def __init__(
        self,
        every_s: float,
        above_bytes: int,
        *,
        min_batches: int = RELEASE_MIN_BATCHES,
        release: Callable[[], object] = release_free_memory,
        clock: Callable[[], float] = time.monotonic,
        resident: Callable[[], int] = rss_bytes,
    ) -> None:
        if every_s <= 0 or above_bytes <= 0 or min_batches < 1:
            raise ValueError("every_s and above_bytes must be > 0, min_batches >= 1")
        self.every_s = every_s
        self.above_bytes = above_bytes
        self.min_batches = min_batches
        self._release = release
        self._clock = clock
        self._resident = resident
        self._last = clock()
        self._floor = resident()
        self._batches = 0
        self.releases = 0

    def release(self) -> None:
        """Give the free pages back now and restart the period from here."""
        self._release()
        self.releases += 1
        self._last = self._clock()
        self._floor = self._resident()
        self._batches = 0

    def after_batch(self) -> bool:
        """Release when the period has passed or resident memory grew past the trigger;
        True when it did."""
        self._batches += 1
        due = self._batches >= self.min_batches and self._clock() - self._last >= self.every_s
        if not due and self._resident() - self._floor < self.above_bytes:
            return False
        self.release()
        return True


POLICIES = ("retain", "map_apart", "glibc")
"""The service's two (``LAD_HOST_MEMORY_RETAIN_S`` > 0, = 0) and glibc's own defaults, which
the benchmarks can name to measure one against another."""


def policy_for(retain_s: float) -> str:
    """The policy ``LAD_HOST_MEMORY_RETAIN_S`` names."""
    return "retain" if retain_s > 0 else "map_apart"


def apply(policy: str) -> bool:
    """Set the process's policy (one of :data:`POLICIES`); False where the C library is not
    glibc or did not take it (nothing is changed for "glibc")."""
    if policy not in POLICIES:
        raise ValueError(f"host memory policy {policy!r}: one of {', '.join(POLICIES)}")
    if policy == "retain":
        applied = keep_freed_memory()
    elif policy == "map_apart":
        applied = map_blocks_apart()
    else:
        applied = _glibc() is not None
    log.info("host memory: %s%s", policy, "" if applied else " (not applied: not glibc)")
    return applied
