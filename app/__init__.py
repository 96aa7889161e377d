"""lad-serve: position-debiased multi-image retrieval with multimodal LLMs."""

__version__ = "0.1.0"
