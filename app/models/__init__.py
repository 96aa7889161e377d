"""One adapter per MLLM family, a registry keyed by config ``model_type`` and a loader."""
