"""ProfileService: the service's profile operations over a real store and a tiny runner.

Every store call runs off the event loop (a recording store checks the thread), the engine
check refuses a profile calibrated under other layers, and the operations answer in wire
schemas or the service's own errors.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from app import errors
from app.observability.metrics import Metrics
from app.service.profile_service import ProfileService, calibration_of
from calibration_store import Profile, open_store


class RecordingStore:
    """A memory store that notes the thread of every call."""

    def __init__(self) -> None:
        self.inner = open_store("memory://")
        self.threads: list[int] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.threads.append(threading.get_ident())
            return attr(*args, **kwargs)

        return call


@pytest.fixture(scope="module")
def runner(shared_runner: Any) -> Any:
    return shared_runner("qwen2_5_vl", layers=(1, 2))


def _profile(service: ProfileService, layers: list[int], seed: int = 0, n: int = 3) -> Profile:
    rng = np.random.default_rng(seed)
    return Profile.create(
        name="default",
        fingerprint=service.fingerprint("digits", n),
        layers=layers,
        bias_matrix=rng.normal(size=(n, n)),
        attention_prior=rng.random((len(layers), n)),
        num_examples=5,
        num_forward_passes=5 * n,
    )


def test_operations_run_off_the_event_loop_and_answer_in_schemas(runner: Any) -> None:
    store = RecordingStore()
    service = ProfileService(runner, store, Metrics())

    async def scenario() -> int:
        loop_thread = threading.get_ident()
        await service.put(_profile(service, [1, 2], seed=0))
        await service.put(_profile(service, [1, 2], seed=1))
        listed = await service.list()
        assert [e.current_version for p in listed.profiles for e in p.entries] == [2]
        detail = await service.detail("default")
        assert [v.version for v in detail.entries[0].versions] == [1, 2]
        rolled = await service.rollback("default", "digits", 3, None)
        assert (rolled.version, rolled.previous_version) == (1, 2)
        assert (await service.delete("default", "1,2,3", 3)).deleted
        with pytest.raises(errors.ProfileNotFound):
            await service.detail("default")
        with pytest.raises(errors.InvalidLabels):
            await service.delete("default", "klingon", 3)
        return loop_thread

    loop_thread = asyncio.run(scenario())
    assert store.threads and loop_thread not in store.threads


def test_current_checks_the_engine(runner: Any) -> None:
    service = ProfileService(runner, open_store("memory://"), Metrics())
    assert service.current("default", "digits", 3) is None
    good = service.store.put(_profile(service, [1, 2]))
    assert service.current("default", "digits", 3) == good and service.compatible(good)
    np.testing.assert_array_equal(calibration_of(good).bias_matrix, good.bias_matrix_array())
    other = service.store.put(_profile(service, [0, 1], seed=2))
    assert not service.compatible(other)
    with pytest.raises(errors.ProfileMismatch, match="layers"):
        service.current("default", "digits", 3)
