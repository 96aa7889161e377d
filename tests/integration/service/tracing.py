"""A profile of one request over the project's own files: which files its calls cross and
how many times the labels are resolved (``resolve_labels``, the one function every
resolution of a labels value to its N strings goes through).

``sys.setprofile`` sees the calling thread only, and ``threading.setprofile`` the threads
started after it: start the trace before the app (its worker thread, the event loop's
portal and the thread pool are then all seen), and ``record()`` around the one request.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
PROJECT = tuple(str(ROOT / part) + "/" for part in ("app", "calibration_store", "clients/python"))
LABELS_FILE = str(ROOT / "app/engine/labels.py")


@dataclass
class Trace:
    """What the recorded calls crossed: files (relative to the repository) and calls by name."""

    recording: bool = False
    files: set[str] = field(default_factory=set)
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not self.recording:
            return
        path = frame.f_code.co_filename
        if path.startswith(PROJECT):
            rel = str(Path(path).relative_to(ROOT))
            with self.lock:
                self.files.add(rel)
                self.calls[(rel, frame.f_code.co_name)] += 1

    @property
    def label_resolutions(self) -> int:
        return self.calls[(str(Path(LABELS_FILE).relative_to(ROOT)), "resolve_labels")]

    @contextmanager
    def record(self) -> Iterator[Trace]:
        self.files.clear()
        self.calls.clear()
        self.recording = True
        try:
            yield self
        finally:
            self.recording = False


@contextmanager
def traced() -> Iterator[Trace]:
    """Profile this thread and every thread started inside the block (nothing recorded
    until ``Trace.record``)."""
    trace = Trace()
    sys.setprofile(trace._profile)
    threading.setprofile(trace._profile)
    try:
        yield trace
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.setprofile(None)
