from __future__ import annotations

from fastapi import APIRouter

from app.api import views
from app.api.deps import RuntimeDep
from app.api.responses import JSONResponse

router = APIRouter(tags=["status"])


@router.get("/_status")
async def status(rt: RuntimeDep) -> JSONResponse:
    """Liveness plus database reachability; never reports configuration secrets."""
    database = await rt.health.database()
    healthy = database == "ok"
    body = {
        "status": "ok" if healthy else "degraded",
        "database": {"dialect": rt.config.database.dialect, "status": database},
    }
    return JSONResponse(body, status_code=200 if healthy else 503)


@router.get("/job-status")
async def job_status(rt: RuntimeDep) -> JSONResponse:
    """Jobs by channel, consumer and status with the oldest and newest job's creation time, as
    the Go original's (from counters kept with each change: no count of job rows)."""
    return JSONResponse(views.job_status(await rt.job_status.by_consumer()))


@router.get("/dlq-status")
async def dlq_status(rt: RuntimeDep) -> JSONResponse:
    """Dead jobs per consumer, as the Go original's."""
    return JSONResponse(views.dlq_status(await rt.job_status.dead_by_consumer()))
