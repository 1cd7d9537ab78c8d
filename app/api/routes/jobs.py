"""The seed spec's pull API: queued jobs, job state changes, job reads and the DLQ."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.api import schemas, views
from app.api.body import body_after_credentials, request_body
from app.api.deps import (
    FORM_CONTENT_TYPE,
    CredentialsDep,
    CursorDep,
    RuntimeDep,
    urlencoded_form,
)
from app.api.openapi import (
    CONSUMER,
    CURSOR,
    DATABASE,
    JOB_PATH,
    JSON_BODY,
    LIMIT,
    PULL_ONLY,
    answer,
    errors,
    form_body,
    json_body,
)
from app.api.reads import READ_FROM, ReadNoteDep
from app.api.responses import JSONResponse
from app.domain.errors import InvalidInput
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


@router.get(
    "/channel/{channel_id}/consumer/{consumer_id}/queued-jobs",
    response_model=schemas.QueuedJobs,
    responses={
        200: answer("due QUEUED jobs, highest priority first", READ_FROM),
        **errors(LIMIT, CURSOR, CONSUMER, PULL_ONLY, DATABASE),
    },
)
async def queued_jobs(
    creds: CredentialsDep,
    rt: RuntimeDep,
    cursor: CursorDep,
    read: ReadNoteDep,
    limit: str | None = None,
) -> JSONResponse:
    size = parse_limit(limit)
    page = await rt.seed_jobs.queued_jobs(creds, size, cursor)
    pages = {}
    if page.next_cursor:
        pages["next"] = f"{_base(creds)}/queued-jobs?limit={size}&next={page.next_cursor}"
    body = {"Result": [views.queued_job(j) for j in page.items], "Pages": pages}
    return JSONResponse(body, headers=read.header)


@router.post(
    "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}",
    status_code=202,
    response_class=Response,
    responses={
        202: answer("moved, or already in that state"),
        **errors(
            JSON_BODY,
            {400: "a move the state machine does not allow, or another worker moved the job"},
            JOB_PATH,
            CONSUMER,
            PULL_ONLY,
            {409: "INFLIGHT past maxAckPending, or on a consumer with a priority policy"},
            DATABASE,
        ),
    },
    openapi_extra=json_body(schemas.NextStateBody, required=True),
)
async def set_job_state(
    job_id: str, creds: CredentialsDep, rt: RuntimeDep, request: Request
) -> Response:

    async def parse() -> schemas.NextStateBody:
        return schemas.parse(schemas.NextStateBody, await request_body(request))

    body = await body_after_credentials(request, parse, lambda: rt.pulls.authenticate(creds))
    await rt.seed_jobs.set_state(creds, job_id, body.NextState, body.IncrementalTimeout)
    return Response(status_code=202)


@router.get(
    "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}",
    response_model=schemas.Job,
    responses={
        200: answer("the job and its message"),
        **errors(JOB_PATH, CONSUMER, DATABASE),
    },
)
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
    "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}/requeue-dead-job",
    status_code=202,
    response_class=Response,
    responses={
        202: answer("queued again"),
        **errors({400: "the job is not DEAD"}, JOB_PATH, CONSUMER, DATABASE),
    },
)
async def requeue_dead_job(job_id: str, creds: CredentialsDep, rt: RuntimeDep) -> Response:
    await rt.seed_jobs.requeue_dead_job(creds, job_id)
    return Response(status_code=202)


@router.delete(
    "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}",
    status_code=204,
    response_class=Response,
    responses={
        204: answer("deleted"),
        **errors({400: "the job is not DEAD"}, JOB_PATH, CONSUMER, DATABASE),
    },
)
async def delete_dead_job(job_id: str, creds: CredentialsDep, rt: RuntimeDep) -> Response:
    await rt.seed_jobs.delete_dead_job(creds, job_id)
    return Response(status_code=204)


@router.get(
    "/channel/{channel_id}/consumer/{consumer_id}/dlq",
    response_model=schemas.DeadJobs,
    responses={
        200: answer("a page of dead jobs", READ_FROM),
        **errors(LIMIT, CURSOR, CONSUMER, DATABASE),
    },
)
async def dead_letters(
    creds: CredentialsDep,
    rt: RuntimeDep,
    cursor: CursorDep,
    read: ReadNoteDep,
    limit: str | None = None,
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
    return JSONResponse({"DeadJobs": dead, "Pages": pages}, headers=read.header)


@router.delete(
    "/channel/{channel_id}/consumer/{consumer_id}/dlq",
    response_model=schemas.Deleted,
    responses={200: answer("every dead job deleted"), **errors(CONSUMER, DATABASE)},
)
async def purge_dead(creds: CredentialsDep, rt: RuntimeDep) -> JSONResponse:
    """Every dead job of the consumer deleted (the Go original's answer)."""
    return JSONResponse({"deletedCount": await rt.seed_jobs.purge_dead(creds)})


@router.post(
    "/channel/{channel_id}/consumer/{consumer_id}/dlq",
    status_code=202,
    response_model=schemas.Requeued,
    responses={
        202: answer("every dead job queued again"),
        **errors(
            CONSUMER,
            {400: "`requeue` form param must match consumer token"},
            {404: "(the form) no such channel or consumer"},
            DATABASE,
        ),
    },
    openapi_extra=form_body(schemas.DlqForm, required=False),
)
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
