"""One handler per feature: retrieve, rerank, calibrate, feedback and refresh each call
their stages (``app.service.pipeline.STAGES``) in order, as plain code, each timed by
``pipeline.stage``, over one per-request context; profiles' store operations take no
stages. ``Handlers`` holds one of
each; the routes get theirs through a dependency (``app.api.deps``)."""

from __future__ import annotations

from dataclasses import dataclass

from app.service.handlers.calibrate import Calibrate
from app.service.handlers.feedback import Feedback, Refresh
from app.service.handlers.profiles import Profiles
from app.service.handlers.rerank import Rerank
from app.service.handlers.retrieve import Retrieve
from app.service.online import OnlineService
from app.service.pipeline import Pipeline


@dataclass(frozen=True)
class Handlers:
    """The handler of every feature, over one pipeline and one online loop."""

    retrieve: Retrieve
    rerank: Rerank
    calibrate: Calibrate
    feedback: Feedback
    refresh: Refresh
    profiles: Profiles

    @classmethod
    def build(cls, pipeline: Pipeline, online: OnlineService) -> Handlers:
        refresh = Refresh(pipeline, online)
        return cls(
            retrieve=Retrieve(pipeline, online),
            rerank=Rerank(pipeline),
            calibrate=Calibrate(pipeline),
            feedback=Feedback(pipeline, online, refresh),
            refresh=refresh,
            profiles=Profiles(online),
        )


__all__ = ["Calibrate", "Feedback", "Handlers", "Profiles", "Refresh", "Rerank", "Retrieve"]
