"""``lad bench cache``'s replayed stream: Zipf popularity, distinct candidates per request."""

from __future__ import annotations

from collections import Counter

from lad_lab.bench.cache import zipf_stream


def test_the_stream_draws_distinct_candidates_with_zipf_popularity() -> None:
    stream = zipf_stream(catalogue=64, requests=400, n=4, exponent=1.1, seed=5)
    assert len(stream) == 400 and all(len(set(r)) == 4 for r in stream)
    counts = Counter(i for r in stream for i in r)
    assert set(counts) <= set(range(64))
    top, tail = counts[0], sum(counts[i] for i in range(48, 64)) / 16
    assert top > 4 * tail  # rank 1 is drawn far more often than the last quarter
    assert zipf_stream(64, 10, 4, 1.1, seed=5) == stream[:10]  # replayable
