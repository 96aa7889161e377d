"""OpenMP's wait policy for the model's threads, set before torch is imported.

Why: by default an OpenMP worker that runs out of work spins for a while before it sleeps
(GOMP_SPINCOUNT / KMP_BLOCKTIME). Between two forwards of a served model that spinning
takes the cores the HTTP loop, image decode and the batcher need. ``PASSIVE`` makes idle
workers sleep at once. The OpenMP runtime reads the variable when torch loads it, so this
must run before the first ``import torch``; a value the operator set is left alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

WAIT_POLICY = "OMP_WAIT_POLICY"
DEFAULT_WAIT_POLICY = "PASSIVE"


def configure(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set OMP_WAIT_POLICY=PASSIVE unless it is set already; the value in force (None when
    torch was imported first, so that setting it now would change nothing)."""
    env = os.environ if environ is None else environ
    if WAIT_POLICY in env:
        return env[WAIT_POLICY]
    if environ is None and "torch" in sys.modules:
        return None
    env[WAIT_POLICY] = DEFAULT_WAIT_POLICY
    return DEFAULT_WAIT_POLICY
