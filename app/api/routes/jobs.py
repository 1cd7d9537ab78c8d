"""The seed spec's pull API: queued jobs, job state changes, job reads and the DLQ."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.api import views
from app.api.body import MAX_INT32, body_after_credentials, json_object, whole_number
from app.api.deps import (
    FORM_CONTENT_TYPE,
    CredentialsDep,
    CursorDep,
    RuntimeDep,
    urlencoded_form,
)
from app.api.responses import JSONResponse
from app.domain.errors import InvalidInput
from app.domain.jobs import JobStatus, parse_next_state
from app.domain.pulls import ConsumerCredentials

router = APIRouter(tags=["pull (seed spec)"])

DEFAULT_LIMIT = 25
MAX_LIMIT = 100


def parse_limit(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput("limit must be an integer") from None
    if value < 0:
        raise InvalidInput("limit must not be negative")
    return min(value, MAX_LIMIT)


def _base(creds: ConsumerCredentials) -> str:
    return views.consumer_path(creds.channel_id, creds.consumer_id)


@router.get("/channel/{channel_id}/consumer/{consumer_id}/queued-jobs")
async def queued_jobs(
    creds: CredentialsDep, rt: RuntimeDep, cursor: CursorDep, limit: str | None = None
) -> JSONResponse:
    size = parse_limit(limit)
    page = await rt.seed_jobs.queued_jobs(creds, size, cursor)
    pages = {}
    if page.next_cursor:
        pages["next"] = f"{_base(creds)}/queued-jobs?limit={size}&next={page.next_cursor}"
    return JSONResponse({"Result": [views.queued_job(j) for j in page.items], "Pages": pages})


@router.post("/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}", status_code=202)
async def set_job_state(
    job_id: str, creds: CredentialsDep, rt: RuntimeDep, request: Request
) -> Response:

    async def parse() -> tuple[JobStatus, int | None]:
        body = await json_object(request)
        target = parse_next_state(body.get("NextState"))
        raw = body.get("IncrementalTimeout")
        if raw is None:
            return target, None
        return target, whole_number(raw, "IncrementalTimeout", maximum=MAX_INT32)

    target, timeout = await body_after_credentials(
        request, parse, lambda: rt.pulls.authenticate(creds)
    )
    await rt.seed_jobs.set_state(creds, job_id, target, timeout)
    return Response(status_code=202)


@router.get("/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}")
async def get_job(job_id: str, creds: CredentialsDep, rt: RuntimeDep) -> JSONResponse:
    claimed = await rt.seed_jobs.get_job(creds, job_id)
    base = _base(creds)
    body = views.job_state(claimed.job)
    body["Message"] = views.job_message(claimed.message)
    body["Links"] = {
        "self": f"{base}/job/{job_id}",
        "message": views.message_path(creds.channel_id, claimed.message.message_id),
        "consumer": base,
        "requeue": f"{base}/job/{job_id}/requeue-dead-job",
    }
    return JSONResponse(body)


@router.post(
    "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}/requeue-dead-job", status_code=202
)
async def requeue_dead_job(job_id: str, creds: CredentialsDep, rt: RuntimeDep) -> Response:
    await rt.seed_jobs.requeue_dead_job(creds, job_id)
    return Response(status_code=202)


@router.delete("/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}", status_code=204)
async def delete_dead_job(job_id: str, creds: CredentialsDep, rt: RuntimeDep) -> Response:
    await rt.seed_jobs.delete_dead_job(creds, job_id)
    return Response(status_code=204)


@router.get("/channel/{channel_id}/consumer/{consumer_id}/dlq")
async def dead_letters(
    creds: CredentialsDep, rt: RuntimeDep, cursor: CursorDep, limit: str | None = None
) -> JSONResponse:
    size = parse_limit(limit)
    page = await rt.seed_jobs.dead_jobs(creds, cursor, size)
    base = _base(creds)
    pages = {"next": f"{base}/dlq?limit={size}&next={page.next_cursor}"} if page.next_cursor else {}
    dead = [
        {
            **views.job_state(job),
            "JobURL": f"{base}/job/{job.id}",
            "JobRequeueURL": f"{base}/job/{job.id}/requeue-dead-job",
        }
        for job in page.items
    ]
    return JSONResponse({"DeadJobs": dead, "Pages": pages})


@router.delete("/channel/{channel_id}/consumer/{consumer_id}/dlq")
async def purge_dead(creds: CredentialsDep, rt: RuntimeDep) -> JSONResponse:
    """Every dead job of the consumer deleted (the Go original's answer)."""
    return JSONResponse({"deletedCount": await rt.seed_jobs.purge_dead(creds)})


@router.post("/channel/{channel_id}/consumer/{consumer_id}/dlq", status_code=202)
async def requeue_all_dead(creds: CredentialsDep, rt: RuntimeDep, request: Request) -> JSONResponse:
    """Every dead job of the consumer queued again: with the token headers, or the Go
    original's form `requeue=<consumer token>`."""
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type == FORM_CONTENT_TYPE:
        # The credential is in the body here: read it bounded, as every form.
        form = await urlencoded_form(request)
        count = await rt.seed_jobs.requeue_all_dead_by_form(
            creds.channel_id, creds.consumer_id, form.get("requeue")
        )
    else:
        count = await rt.seed_jobs.requeue_all_dead(creds)
    return JSONResponse({"Requeued": count}, status_code=202)
