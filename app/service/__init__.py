"""The service layer: the handler (`Service`), its model worker and its profile operations."""

from app.service.core import Service

__all__ = ["Service"]
