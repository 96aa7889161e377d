"""Model-agnostic core: debiasing math, label scoring, attention capture, runner, batcher."""
