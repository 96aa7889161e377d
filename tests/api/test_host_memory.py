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
    released, every 0.3 s of work, while the stream runs."""
    client = make_client(host_memory_retain_s=60, host_memory_trim_every_s=0.3)
    schedule = client.app.state.service.worker.release
    released: list[float] = []

    def release() -> bool:  # the real release, observed
        released.append(time.perf_counter())
        return release_free_memory()

    schedule._release = release
    body = retrieve_body(items[0]) | {"method": "vanilla"}
    start = time.perf_counter()
    answered = 0
    while time.perf_counter() - start < 1.5:
        assert client.post("/v1/retrieve", json=body).status_code == 200
        answered += 1
    last = time.perf_counter()
    assert answered >= 5
    assert released and all(start < t < last for t in released)
    assert schedule.releases == len(released)
