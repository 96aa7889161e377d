"""One handler per feature (retrieve, rerank, calibrate, profiles, feedback): each takes
its feature's wire schemas, runs the stages of ``app.service.pipeline`` and returns its
wire schema. ``app.service.core.Service`` is the one entry the routes call."""

from app.service.handlers import calibrate, feedback, profiles, rerank, retrieve

__all__ = ["calibrate", "feedback", "profiles", "rerank", "retrieve"]
