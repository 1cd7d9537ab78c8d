from __future__ import annotations

from fastapi import APIRouter, Response

from app.api import schemas, views
from app.api.deps import ReaderDep, RuntimeDep
from app.api.openapi import UNAVAILABLE, answer, errors
from app.api.reads import READ_FROM, ReadNoteDep
from app.api.responses import JSONResponse
from app.metrics import CONTENT_TYPE

router = APIRouter(tags=["status"])


@router.get(
    "/_status",
    response_model=schemas.Status,
    responses={
        200: answer("the broker is up"),
        503: {"model": schemas.Status, "description": "the database does not answer"},
    },
)
async def status(rt: RuntimeDep) -> JSONResponse:
    """Liveness plus database reachability and schema; never reports configuration secrets."""
    database = await rt.health.database()
    healthy = database == "ok"
    body = {
        "status": "ok" if healthy else "degraded",
        "database": {
            "dialect": rt.config.database.dialect,
            "status": database,
            "schema": await rt.health.schema() if healthy else "unknown",
        },
    }
    return JSONResponse(body, status_code=200 if healthy else 503)


@router.get(
    "/_ready",
    response_model=schemas.Ready,
    responses={
        200: answer("ready for work"),
        503: {"model": schemas.Ready, "description": "not ready (reasons)"},
    },
)
async def ready(rt: RuntimeDep) -> JSONResponse:
    """Ready for work: the database answers, its schema is current, and the process is not
    draining (503 otherwise, with the reason)."""
    database = await rt.health.database()
    schema = await rt.health.schema() if database == "ok" else "unknown"
    reasons = [
        *([] if database == "ok" else [f"database {database}"]),
        *([] if schema == "current" or database != "ok" else [f"schema {schema}"]),
        *(["draining"] if rt.draining else []),
    ]
    body = {"ready": not reasons, "reasons": reasons}
    return JSONResponse(body, status_code=503 if reasons else 200)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            **answer("Prometheus text format"),
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **errors(UNAVAILABLE),
    },
)
async def metrics(rt: RuntimeDep) -> Response:
    """Prometheus text format (app/metrics.py says what is there)."""
    return Response(await rt.scrape(), media_type=CONTENT_TYPE)


@router.get(
    "/job-status",
    response_model=schemas.JobStatus,
    responses={
        200: answer("jobs by channel, consumer and status", READ_FROM),
        **errors(UNAVAILABLE),
    },
)
async def job_status(rt: RuntimeDep, _read: ReaderDep, read: ReadNoteDep) -> JSONResponse:
    """Jobs by channel, consumer and status with the oldest and newest job's creation time, as
    the Go original's (from counters kept with each change: no count of job rows)."""
    return JSONResponse(views.job_status(await rt.job_status.by_consumer()), headers=read.header)


@router.get(
    "/dlq-status",
    response_model=schemas.DlqStatus,
    responses={200: answer("dead jobs per consumer", READ_FROM), **errors(UNAVAILABLE)},
)
async def dlq_status(rt: RuntimeDep, _read: ReaderDep, read: ReadNoteDep) -> JSONResponse:
    """Dead jobs per consumer, as the Go original's."""
    body = views.dlq_status(await rt.job_status.dead_by_consumer())
    return JSONResponse(body, headers=read.header)
