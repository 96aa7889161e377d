"""The service layer: `Service` (one model, one queue, one store, one handler per feature),
the stages every request runs (``pipeline``), the decode stage, the model worker and the
profile and online services."""

from app.service.core import Service

__all__ = ["Service"]
