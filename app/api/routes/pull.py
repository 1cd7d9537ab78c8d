"""Our pull API: batch claims with long polling or a stream, and acks (single and batched)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from app.api import schemas, views
from app.api.body import body_after_credentials, request_body
from app.api.deps import BoundRoute, CredentialsDep, RuntimeDep
from app.api.openapi import (
    CONSUMER,
    DATABASE,
    JOB_PATH,
    JSON_BODY,
    PULL_ONLY,
    answer,
    component,
    errors,
    json_body,
)
from app.api.responses import JSONResponse, NdjsonStream
from app.domain.jobs import AckType
from app.domain.priority import PullPriority
from app.domain.pulls import AckItem, AckOutcome, AckResult, PullRequest

router = APIRouter(tags=["pull"], route_class=BoundRoute)


def to_pull_request(body: schemas.PullBody, max_expires: float) -> PullRequest:
    """Without "expires", wait 30 s or max-expires-seconds if that is lower."""
    expires = body.expires if "expires" in body.model_fields_set else min(body.expires, max_expires)
    return PullRequest(
        batch=body.batch,
        max_bytes=body.max_bytes,
        expires=expires,
        no_wait=body.no_wait,
        incremental_timeout=body.incremental_timeout,
        terms=PullPriority(
            group=body.group or None,
            min_pending=body.min_pending,
            min_ack_pending=body.min_ack_pending,
            pin_id=body.id or None,
            priority=body.priority,
        ),
        stream=body.stream,
        idle_heartbeat=body.idle_heartbeat,
    )


def ack_item(body: schemas.AckFields, job_id: int) -> AckItem:
    return AckItem(job_id, body.type, body.attempt, body.delay, body.reason, body.counted)


def ack_items(raw: bytes) -> list[AckItem]:
    """A batch ack's body, validated, as the service takes it."""
    return [ack_item(item, item.id) for item in schemas.parse(schemas.AcksBody, raw).acks]


# What became of each ack in a batch, as the status a single ack would answer with.
ACK_STATUS = {
    AckResult.DONE: 202,
    AckResult.EXTENDED: 200,
    AckResult.UNKNOWN_JOB: 404,
    AckResult.NOT_INFLIGHT: 409,
    AckResult.STALE_ATTEMPT: 409,
    AckResult.REPEATED: 409,
}


@router.post(
    "/channel/{channel_id}/consumer/{consumer_id}/pull",
    response_model=schemas.Pulled,
    responses={
        200: {
            **answer("the jobs claimed (none when expires passed); a stream's lines as they come"),
            "content": {
                "application/x-ndjson": {
                    "schema": component("StreamLine", schemas.StreamLine, "serialization")
                }
            },
        },
        **errors(
            JSON_BODY,
            {400: "limits ([pull] max-batch ...) or priority terms the consumer refuses"},
            CONSUMER,
            PULL_ONLY,
            {
                409: "[pull] max-waiting pulls already wait on the consumer",
                423: "the pin id is not (or no longer) the group's pin",
            },
            DATABASE,
        ),
    },
    openapi_extra=json_body(schemas.PullBody, required=False),
)
async def pull(creds: CredentialsDep, rt: RuntimeDep, request: Request) -> Response:

    async def parse() -> PullRequest:
        body = schemas.parse(schemas.PullBody, await request_body(request), empty_ok=True)
        return to_pull_request(body, rt.config.pull.max_expires_seconds)

    pull_request = await body_after_credentials(
        request, parse, lambda: rt.pulls.authenticate(creds)
    )
    if pull_request.stream:
        return NdjsonStream(await rt.pulls.stream(creds, pull_request))
    result = await rt.pulls.pull(creds, pull_request)
    body: dict[str, Any] = {
        "Jobs": [views.pulled_job(j) for j in result.jobs],
        "Pending": result.pending,
    }
    if result.pin_id is not None:
        body["PinId"] = result.pin_id
    return JSONResponse(body)


@router.get(
    "/channel/{channel_id}/consumer/{consumer_id}/info",
    response_model=schemas.ConsumerInfo,
    responses={200: answer("the consumer's figures"), **errors(CONSUMER, PULL_ONLY, DATABASE)},
)
async def info(creds: CredentialsDep, rt: RuntimeDep) -> JSONResponse:
    """The figures the bridge's CONSUMER.INFO gives, for an HTTP client."""
    return JSONResponse(views.consumer_info(await rt.pulls.info(creds)))


@router.post(
    "/channel/{channel_id}/consumer/{consumer_id}/unpin",
    response_model=schemas.Unpinned,
    responses={
        200: answer("the pin is cleared (Unpinned: whether one was held)"),
        **errors(
            JSON_BODY,
            {400: "no group, or not the consumer's group"},
            CONSUMER,
            PULL_ONLY,
            DATABASE,
        ),
    },
    openapi_extra=json_body(schemas.UnpinBody, required=True),
)
async def unpin(creds: CredentialsDep, rt: RuntimeDep, request: Request) -> JSONResponse:
    """Clear the pin of a pinned_client consumer's group: its next job goes to a standby."""

    async def parse() -> str:
        return schemas.parse(schemas.UnpinBody, await request_body(request)).group

    group = await body_after_credentials(request, parse, lambda: rt.pulls.authenticate(creds))
    unpinned = await rt.pins.unpin_as(creds, group)
    return JSONResponse({"Group": group, "Unpinned": unpinned})


@router.post(
    "/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}/ack",
    response_model=schemas.Lease,
    responses={
        200: answer("progress: the lease is extended"),
        202: answer("acked, naked or termed"),
        **errors(
            JSON_BODY,
            JOB_PATH,
            CONSUMER,
            PULL_ONLY,
            {409: "the job is not in flight, or the attempt is stale"},
            DATABASE,
        ),
    },
    openapi_extra=json_body(schemas.AckBody, required=False),
)
async def ack(job_id: str, creds: CredentialsDep, rt: RuntimeDep, request: Request) -> Response:

    async def parse() -> AckItem:
        # The path names the job: the service reads it from there.
        return ack_item(
            schemas.parse(schemas.AckBody, await request_body(request), empty_ok=True), 0
        )

    item = await body_after_credentials(request, parse, lambda: rt.pulls.authenticate(creds))
    outcome = await rt.acks.ack(creds, job_id, item)
    if item.type is AckType.PROGRESS:
        return JSONResponse({"LeaseExpiresAt": views.iso(outcome.lease_expires_at)})
    return Response(status_code=202)


@router.post(
    "/channel/{channel_id}/consumer/{consumer_id}/ack",
    response_model=schemas.AckResults,
    responses={
        200: answer("one result per item, in order"),
        **errors(
            JSON_BODY,
            {400: "more than [pull] max-batch acks"},
            CONSUMER,
            PULL_ONLY,
            DATABASE,
        ),
    },
    openapi_extra=json_body(schemas.AcksBody, required=True),
)
async def ack_many(creds: CredentialsDep, rt: RuntimeDep, request: Request) -> JSONResponse:

    async def parse() -> list[AckItem]:
        return ack_items(await request_body(request))

    items = await body_after_credentials(request, parse, lambda: rt.pulls.authenticate(creds))
    outcomes = await rt.acks.ack_many(creds, items)
    return JSONResponse({"Results": [ack_result(o) for o in outcomes]})


def ack_result(outcome: AckOutcome) -> dict[str, Any]:
    result: dict[str, Any] = {
        "id": str(outcome.id),
        "status": ACK_STATUS[outcome.result],
        "detail": outcome.detail,
    }
    if outcome.result is AckResult.EXTENDED:
        result["LeaseExpiresAt"] = views.iso(outcome.lease_expires_at)
    return result
