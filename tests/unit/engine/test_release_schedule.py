"""ReleaseSchedule: when a busy model worker gives freed memory back (a fake clock and a
fake resident size; the release itself is app.engine.host_memory's, tested apart)."""

from __future__ import annotations

import pytest

from app.engine.host_memory import ReleaseSchedule

MIB = 2**20


class Fake:
    """A clock and a resident size the test moves; counts the releases."""

    def __init__(self) -> None:
        self.now = 100.0
        self.rss = 800 * MIB
        self.released = 0

    def release(self) -> bool:
        self.released += 1
        self.rss = 800 * MIB  # what a release leaves
        return True

    def schedule(
        self, every_s: float = 5.0, above_mb: int = 512, min_batches: int = 8
    ) -> ReleaseSchedule:
        return ReleaseSchedule(
            every_s,
            above_mb * MIB,
            min_batches=min_batches,
            release=self.release,
            clock=lambda: self.now,
            resident=lambda: self.rss,
        )


def test_a_steady_stream_is_released_once_per_period() -> None:
    fake = Fake()
    schedule = fake.schedule(every_s=5.0)
    for _ in range(100):  # 100 batches of 0.5 s back to back: never idle
        fake.now += 0.5
        fake.rss = 1100 * MIB  # the forwards' freed pages, kept
        schedule.after_batch()
    assert fake.released == schedule.releases == 10  # 50 s of traffic, one per 5 s


def test_long_forwards_release_once_in_min_batches() -> None:
    """Forwards of 10 s: the period passes after each, yet at most one forward in eight
    follows a release (and pays its page faults)."""
    fake = Fake()
    schedule = fake.schedule(every_s=5.0, min_batches=8)
    for _ in range(80):
        fake.now += 10.0
        fake.rss = 1200 * MIB  # one forward's working set (400 MiB), under the trigger
        schedule.after_batch()
    assert fake.released == 10


def test_a_burst_above_the_trigger_is_released_after_its_batch() -> None:
    fake = Fake()
    schedule = fake.schedule(every_s=60.0, above_mb=512)
    fake.now += 0.1
    fake.rss = 800 * MIB + 511 * MIB
    assert not schedule.after_batch()
    fake.rss = 800 * MIB + 512 * MIB
    assert schedule.after_batch() and fake.released == 1
    fake.now += 0.1  # released: the floor is where the release left it
    fake.rss = 900 * MIB
    assert not schedule.after_batch()


def test_the_idle_release_restarts_the_period() -> None:
    fake = Fake()
    schedule = fake.schedule(every_s=5.0, min_batches=1)
    fake.now += 4.0
    schedule.release()  # the idle hook
    fake.now += 4.0
    assert not schedule.after_batch()
    fake.now += 1.0
    assert schedule.after_batch() and fake.released == 2


@pytest.mark.parametrize(("every_s", "above", "batches"), [(0, 1, 1), (1, 0, 1), (1, 1, 0)])
def test_a_schedule_needs_a_period_and_a_trigger(every_s: float, above: int, batches: int) -> None:
    with pytest.raises(ValueError):
        ReleaseSchedule(every_s, above, min_batches=batches)
