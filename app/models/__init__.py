"""One adapter per MLLM family, a registry keyed by config ``model_type`` and a loader; the
bundled demo model's files as package data (``demo/``, located by ``demo_model``)."""
