"""Helpers of the store tests: a profile with random B and P, a poll for a replica's cache."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from calibration_store import (
    Profile,
)


def make_profile(
    name: str = "default",
    *,
    n: int = 4,
    model_id: str = "org/model:v1",
    labels: str = "digits",
    seed: int = 0,
) -> Profile:
    rng = np.random.default_rng(seed)
    return Profile.create(
        name=name,
        fingerprint={
            "model_id": model_id,
            "model_revision": "abc123",
            "dtype": "float32",
            "attention_backend": "sdpa",
            "prompt_hash": "p" * 16,
            "label_scheme": labels,
            "n": n,
        },
        layers=[3, 4],
        bias_matrix=rng.normal(size=(n, n)),
        attention_prior=rng.random(size=(2, n)),
        num_examples=5,
        num_forward_passes=5 * n,
        hyperparameters={"top_k": 2, "tau": 5.0, "variant": "reference", "seed": seed},
    )


def wait_for(predicate: Callable[[], bool], timeout: float = 2.0) -> float:
    """Poll `predicate` (a cache read, never a forced backend read); returns seconds waited."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - start


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` read-only while inside, as a read-only mount or a ConfigMap is: a bind mount
    remounted read-only as root (root writes through file modes), mode 0555 otherwise."""
    if os.geteuid() != 0:
        os.chmod(path, 0o555)
        try:
            yield
        finally:
            os.chmod(path, 0o755)
        return
    mounted = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("root without mount: cannot make a read-only directory here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True)
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)  # lazy: open files
