"""LAD_HOST_MEMORY_RETAIN_S reaches the model worker: with retention, the worker gives the
heap's free pages back once idle that long, and under a steady stream (never idle) on its
release schedule; without, it has nothing to give back."""

from __future__ import annotations

import time

from app.engine.host_memory import release_free_memory
from tests.api.helpers import retrieve_body


def test_the_worker_releases_the_heap_once_idle_for_the_set_time(make_client, items) -> None:
    client = make_client(host_memory_retain_s=0.5)
    batcher = client.app.state.service.worker.batcher
    assert batcher.on_idle == client.app.state.service.worker.release.release
    assert batcher.idle_after_s == 0.5
    ran: list[float] = []
    batcher.on_idle = lambda: ran.append(time.perf_counter())  # observe the real loop
    body = retrieve_body(items[0]) | {"method": "vanilla"}
    assert client.post("/v1/retrieve", json=body).status_code == 200
    answered = time.perf_counter()
    deadline = answered + 10
    while not ran and time.perf_counter() < deadline:
        time.sleep(0.02)
    # not at once: 0.5 s after the batch, which ended just before the answer arrived
    assert ran and ran[0] - answered >= 0.2


def test_without_retention_the_worker_has_no_idle_release(make_client) -> None:
    batcher = make_client(host_memory_retain_s=0).app.state.service.worker.batcher
    assert batcher.on_idle is None


def test_a_busy_worker_releases_the_heap_on_its_schedule(make_client, items) -> None:
    """A stream that never lets the worker idle (retention of 60 s) still sees the heap
    released (0.3 s and 8 batches after the last release) while the stream runs."""
    client = make_client(host_memory_retain_s=60, host_memory_trim_every_s=0.3)
    schedule = client.app.state.service.worker.release
    released: list[float] = []

    def release() -> bool:  # the real release, observed
        released.append(time.perf_counter())
        return release_free_memory()

    schedule._release = release
    body = retrieve_body(items[0]) | {"method": "vanilla"}
    start = time.perf_counter()
    answered: list[float] = []
    while time.perf_counter() - start < 30 and not (released and answered[-1] > released[0]):
        assert client.post("/v1/retrieve", json=body).status_code == 200
        answered.append(time.perf_counter())
    shown = ([t - start for t in released], [t - start for t in answered])
    assert released and answered[-1] > released[0], shown  # released; the stream went on
    # not before 8 batches (the release runs inside the 8th, before its answer)
    assert sum(t < released[0] for t in answered) >= 7, shown
    assert schedule.releases == len(released)
