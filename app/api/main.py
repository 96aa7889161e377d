"""Gathers the routers of app/api/routes (one file per resource)."""

from fastapi import APIRouter

from app.api.routes import calibrate, feedback, health, models, profiles, rerank, retrieve

api_router = APIRouter()
api_router.include_router(retrieve.router)
api_router.include_router(rerank.router)
api_router.include_router(calibrate.router)
api_router.include_router(models.router)
api_router.include_router(profiles.router)
api_router.include_router(feedback.router)
api_router.include_router(health.router)
