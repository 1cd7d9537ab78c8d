"""Our pull API: batch claims with long polling or a stream, and acks (single and batched)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from app.api import views
from app.api.body import (
    MAX_ID,
    MAX_INT32,
    body_after_credentials,
    job_id,
    json_object,
    optional_str,
    seconds,
    whole_number,
)
from app.api.deps import CredentialsDep, RuntimeDep
from app.api.responses import JSONResponse, NdjsonStream
from app.domain.errors import InvalidInput
from app.domain.jobs import AckType
from app.domain.priority import PullPriority
from app.domain.pulls import AckItem, AckResult, PullRequest

router = APIRouter(tags=["pull"])

# The priority group fields are JetStream's, with its names (app/domain/priority.py).
PRIORITY_FIELDS = {"group", "min_pending", "min_ack_pending", "id", "priority"}
PULL_FIELDS = {
    "batch",
    "max_bytes",
    "expires",
    "no_wait",
    "incremental_timeout",
    "stream",
    "idle_heartbeat",
    *PRIORITY_FIELDS,
}
ACK_FIELDS = {"id", "type", "attempt", "delay", "reason", "counted"}


DEFAULT_EXPIRES = 30.0


def parse_pull(body: dict[str, Any], max_expires: float = DEFAULT_EXPIRES) -> PullRequest:
    """The pull body; without "expires", wait 30 s or max-expires-seconds if that is lower."""
    unknown = set(body) - PULL_FIELDS
    if unknown:
        raise InvalidInput(f"unknown field {sorted(unknown)[0]!r}")
    no_wait = body.get("no_wait", False)
    if not isinstance(no_wait, bool):
        raise InvalidInput("no_wait must be true or false")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidInput("stream must be true or false")
    heartbeat = body.get("idle_heartbeat")
    if heartbeat is not None and not stream:
        raise InvalidInput("idle_heartbeat is only allowed with stream true")
    max_bytes = body.get("max_bytes")
    return PullRequest(
        batch=whole_number(body.get("batch", 1), "batch", minimum=1),
        max_bytes=None
        if max_bytes is None
        else whole_number(max_bytes, "max_bytes", minimum=1, maximum=MAX_ID),
        expires=seconds(body.get("expires", min(DEFAULT_EXPIRES, max_expires)), "expires"),
        no_wait=no_wait,
        incremental_timeout=whole_number(
            body.get("incremental_timeout", 0), "incremental_timeout", maximum=MAX_INT32
        ),
        terms=PullPriority(
            group=optional_str(body.get("group"), "group") or None,
            min_pending=whole_number(body.get("min_pending", 0), "min_pending", maximum=MAX_ID),
            min_ack_pending=whole_number(
                body.get("min_ack_pending", 0), "min_ack_pending", maximum=MAX_ID
            ),
            pin_id=optional_str(body.get("id"), "id") or None,
            priority=whole_number(
                body.get("priority", 0), "priority", minimum=-MAX_INT32, maximum=MAX_INT32
            ),
        ),
        stream=stream,
        idle_heartbeat=None if heartbeat is None else seconds(heartbeat, "idle_heartbeat"),
    )


def parse_ack(body: dict[str, Any], given_id: int | None = None) -> AckItem:
    unknown = set(body) - ACK_FIELDS
    if unknown:
        raise InvalidInput(f"unknown field {sorted(unknown)[0]!r}")
    raw_type = body.get("type", "ack")
    try:
        kind = AckType(raw_type)
    except ValueError:
        raise InvalidInput(f"type must be ack, nak, term or progress, not {raw_type!r}") from None
    jid = job_id(body.get("id")) if given_id is None else given_id
    attempt = body.get("attempt")
    delay = body.get("delay")
    if delay is not None and kind is not AckType.NAK:
        raise InvalidInput("delay is only allowed with type nak")
    counted = body.get("counted", True)
    if not isinstance(counted, bool):
        raise InvalidInput("counted must be true or false")
    if not counted and kind is not AckType.NAK:
        raise InvalidInput("counted is only allowed with type nak")
    return AckItem(
        id=jid,
        type=kind,
        attempt=None
        if attempt is None
        else whole_number(attempt, "attempt", minimum=1, maximum=MAX_INT32),
        delay=None if delay is None else seconds(delay, "delay"),
        reason=optional_str(body.get("reason"), "reason"),
        counted=counted,
    )


# What became of each ack in a batch, as the status a single ack would answer with.
ACK_STATUS = {
    AckResult.DONE: 202,
    AckResult.EXTENDED: 200,
    AckResult.UNKNOWN_JOB: 404,
    AckResult.NOT_INFLIGHT: 409,
    AckResult.STALE_ATTEMPT: 409,
    AckResult.REPEATED: 409,
}


@router.post("/channel/{channel_id}/consumer/{consumer_id}/pull")
async def pull(creds: CredentialsDep, rt: RuntimeDep, request: Request) -> Response:

    async def parse() -> PullRequest:
        body = await json_object(request, empty_ok=True)
        return parse_pull(body, rt.config.pull.max_expires_seconds)

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


@router.get("/channel/{channel_id}/consumer/{consumer_id}/info")
async def info(creds: CredentialsDep, rt: RuntimeDep) -> JSONResponse:
    """The figures the bridge's CONSUMER.INFO gives, for an HTTP client."""
    return JSONResponse(views.consumer_info(await rt.pulls.info(creds)))


@router.post("/channel/{channel_id}/consumer/{consumer_id}/unpin")
async def unpin(creds: CredentialsDep, rt: RuntimeDep, request: Request) -> JSONResponse:
    """Clear the pin of a pinned_client consumer's group: its next job goes to a standby."""

    async def parse() -> str:
        body = await json_object(request)
        unknown = set(body) - {"group"}
        if unknown:
            raise InvalidInput(f"unknown field {sorted(unknown)[0]!r}")
        group = optional_str(body.get("group"), "group")
        if not group:
            raise InvalidInput("group is required")
        return group

    group = await body_after_credentials(request, parse, lambda: rt.pulls.authenticate(creds))
    unpinned = await rt.pins.unpin_as(creds, group)
    return JSONResponse({"Group": group, "Unpinned": unpinned})


@router.post("/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}/ack")
async def ack(job_id: str, creds: CredentialsDep, rt: RuntimeDep, request: Request) -> Response:

    async def parse() -> AckItem:
        return parse_ack(await json_object(request, empty_ok=True), given_id=0)

    item = await body_after_credentials(request, parse, lambda: rt.pulls.authenticate(creds))
    outcome = await rt.acks.ack(creds, job_id, item)
    if item.type is AckType.PROGRESS:
        return JSONResponse({"LeaseExpiresAt": views.iso(outcome.lease_expires_at)})
    return Response(status_code=202)


@router.post("/channel/{channel_id}/consumer/{consumer_id}/ack")
async def ack_many(creds: CredentialsDep, rt: RuntimeDep, request: Request) -> JSONResponse:

    async def parse() -> list[AckItem]:
        acks = (await json_object(request)).get("acks")
        if not isinstance(acks, list) or not all(isinstance(a, dict) for a in acks):
            raise InvalidInput("acks must be a list of objects")
        return [parse_ack(a) for a in acks]

    items = await body_after_credentials(request, parse, lambda: rt.pulls.authenticate(creds))
    outcomes = await rt.acks.ack_many(creds, items)
    return JSONResponse(
        {
            "Results": [
                {
                    "id": str(o.id),
                    "status": ACK_STATUS[o.result],
                    "detail": o.detail,
                    **(
                        {"LeaseExpiresAt": views.iso(o.lease_expires_at)}
                        if o.result is AckResult.EXTENDED
                        else {}
                    ),
                }
                for o in outcomes
            ]
        }
    )
