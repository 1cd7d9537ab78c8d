from __future__ import annotations

from fastapi import APIRouter

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
