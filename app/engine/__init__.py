"""The torch runtime: the runner (one forward -> scores and attention), the capture inside
SDPA, the label trie and head over the KV cache, the batcher (the math is ``app.method``)."""
