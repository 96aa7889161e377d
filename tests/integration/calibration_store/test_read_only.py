"""A store that cannot write still serves, and never half-writes (issue 29): a read-only
directory opens with what it holds, and a save that fails leaves nothing changed in
memory (the client is told 503; its retry is counted once)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from calibration_store import Evidence, ProfileKey, StoreUnavailable, open_online_store
from calibration_store.evidence import COUNTED, DUPLICATE
from calibration_store.local import FileProfileStore
from tests.integration.calibration_store.stores import make_profile, read_only


def test_a_read_only_directory_serves_its_profiles_and_refuses_writes(tmp_path: Path) -> None:
    writer = FileProfileStore(tmp_path)
    stored = writer.put(make_profile())
    writer.close()
    with read_only(tmp_path):
        store = FileProfileStore(tmp_path)  # main: StoreUnavailable (lad serve exits 3)
        assert store.get(stored.key) == stored
        assert store.health()["writes"] == "failing"
        for write in (
            lambda: store.put(make_profile(seed=1)),
            lambda: store.rollback(stored.key, 1),
            lambda: store.delete(stored.key),
        ):
            with pytest.raises(StoreUnavailable):
                write()
        assert store.get(stored.key) == stored and store.versions(stored.key) == [1]
        assert store.check_writes(force=True) is False
        store.close()


def test_an_unreadable_directory_is_still_unavailable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreUnavailable):
        FileProfileStore(tmp_path / "file" / "below")


KEY = ProfileKey(model_id="m", name="default", label_scheme="digits", n=3)


def _evidence(seed: int) -> Evidence:
    rng = np.random.default_rng(seed)
    return Evidence.of(KEY, 1, rng.normal(size=3), rng.random(size=(2, 3)), held_out=False)


def test_a_failed_save_rolls_back_feedback_refresh_and_reset(tmp_path: Path) -> None:
    """Main kept the change in memory: the retry after the disk recovered answered
    ``counted: false`` although the client had been told the first try failed."""
    online = open_online_store(str(tmp_path))
    online.put_evidence("a", _evidence(0))
    online.put_evidence("b", _evidence(1))
    assert online.feedback("a", 1, True).outcome == COUNTED
    before = online.snapshot(KEY, 2)
    with read_only(tmp_path):
        with pytest.raises(StoreUnavailable):
            online.feedback("b", 2, True)
        with pytest.raises(StoreUnavailable):
            online.record_refresh(KEY, {"live": True})
        with pytest.raises(StoreUnavailable):
            online.reset(KEY)
        with pytest.raises(StoreUnavailable):
            online.claim_refresh(KEY, 1)  # one feedback since the last refresh: due
        during = online.snapshot(KEY, 2)
    assert during.count == before.count == 1
    np.testing.assert_array_equal(during.row_sums, before.row_sums)
    assert during.last_refresh == before.last_refresh
    assert during.since_refresh == before.since_refresh == 1  # the claim was not lost
    retry = online.feedback("b", 2, True)
    assert retry.outcome == COUNTED  # counted once, now
    assert online.feedback("b", 2, True).outcome == DUPLICATE
    assert open_online_store(str(tmp_path)).snapshot(KEY, 2).count == 2
