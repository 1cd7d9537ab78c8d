"""Publishing (broadcast) and reading a channel's messages."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response

from app.api import schemas, views
from app.api.body import request_body
from app.api.deps import BoundRoute, ChannelReaderDep, CursorDep, RuntimeDep
from app.api.limits import already_buffered
from app.api.openapi import CHANNEL, CURSOR, DATABASE, PRODUCER, answer, errors, header
from app.api.reads import READ_FROM, ReadNoteDep
from app.api.responses import JSONResponse
from app.domain.errors import InvalidInput, NotFound
from app.services.publishing import Broadcast

router = APIRouter(tags=["messages"], route_class=BoundRoute)


@router.post(
    "/channel/{channel_id}/broadcast",
    status_code=201,
    response_class=Response,
    responses={
        201: answer("stored with its jobs", "Location"),
        **errors(
            PRODUCER,
            {
                400: "an empty body, a bad priority, message id, content type,"
                " metadata header name or X-Broker-Scheduled-For",
                409: "the message id was published before",
                412: "X-Broker-Scheduled-For is less than the minimum delay ahead",
                413: "the body is over [broker] max-message-size-bytes",
            },
            DATABASE,
        ),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "the payload, kept as it is with its Content-Type",
            "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
        },
        # Read by hand (app/services/publishing.py checks them), not parsed for every publish.
        "parameters": [
            header("X-Broker-Channel-Token", "the channel's token"),
            header("X-Broker-Producer-ID", "the publishing producer"),
            header("X-Broker-Producer-Token", "the producer's token"),
            header(
                "X-Broker-Message-ID",
                "an idempotency key per channel",
                {"type": "string", "maxLength": 255},
            ),
            header(
                "X-Broker-Message-Priority",
                "higher is delivered first; its absolute value is kept",
                {"type": "string", "pattern": "^-?[0-9]{1,10}$"},
            ),
            header("X-Broker-Metadata-Headers", "comma-separated request headers to keep"),
            header(
                "X-Broker-Scheduled-For",
                "RFC 3339 with an offset: due then",
                {"type": "string", "format": "date-time"},
            ),
        ],
    },
)
async def broadcast(channel_id: str, request: Request, rt: RuntimeDep) -> Response:
    headers = request.headers
    sent = Broadcast(
        # Channel and producer tokens as they are stored (keyed hashes).
        channel_token=rt.tokens.digest.optional(headers.get("X-Broker-Channel-Token")),
        producer_id=headers.get("X-Broker-Producer-ID"),
        producer_token=rt.tokens.digest.optional(headers.get("X-Broker-Producer-Token")),
        payload=b"",  # read below, once the credentials allow it
        content_type=headers.get("Content-Type"),
        priority=headers.get("X-Broker-Message-Priority"),
        message_id=headers.get("X-Broker-Message-ID"),
        metadata_header_names=headers.get("X-Broker-Metadata-Headers"),
        headers=headers,
        scheduled_for=headers.get("X-Broker-Scheduled-For"),
    )
    # A body the server does not hold yet (chunked, large) is read only for a producer whose
    # credentials hold, and never past the message size limit (app/api/body.py).
    limit = rt.config.broker.max_message_size_bytes
    if not already_buffered(headers, limit):
        await rt.publishing.check_credentials(channel_id, sent)
    payload = await request_body(request, limit)
    message = await rt.publishing.publish(channel_id, replace(sent, payload=payload))
    if message.scheduled_for is not None:
        location = views.scheduled_message_path(channel_id, message.message_id)
    else:
        location = views.message_path(channel_id, message.message_id)
    return Response(status_code=201, headers={"Location": location})


# The Go original's status filters, its names or its numbers, to `due` (MessageStore.list). A
# message's jobs are made as it is stored, so a Go message is never ACKNOWLEDGED here for
# longer than its transaction: what stays "acknowledged, not dispatched" is a scheduled message
# whose time has not come.
# Go's numbers start at 101: in storage/data/message.go and scheduledmessage.go a lock-prefix
# constant opens the same const block, so `iota + 100` is already 101 on the first status.
SCHEDULE_FILTER = {"SCHEDULED": False, "101": False, "DISPATCHED": True, "102": True}
MESSAGE_FILTER = {"ACKNOWLEDGED": False, "101": False, "DISPATCHED": True, "102": True}


StatusQuery = Annotated[list[str] | None, Query()]


def status_filter(given: list[str] | None, known: dict[str, bool]) -> bool | None:
    """`status` may be repeated (Go reads every one); None when it does not narrow."""
    wanted = set()
    for raw in given or []:
        if raw.upper() not in known:
            names = " or ".join(k for k in known if not k.isdigit())
            raise InvalidInput(f"status must be {names} (or the Go numbers 101, 102)")
        wanted.add(known[raw.upper()])
    return wanted.pop() if len(wanted) == 1 else None


@router.get(
    "/channel/{channel_id}/scheduled-messages",
    response_model=schemas.ScheduledLinks,
    responses={
        200: answer("a page of scheduled message links", READ_FROM),
        **errors(
            CURSOR, {400: "status is not SCHEDULED, DISPATCHED, 101 or 102"}, CHANNEL, DATABASE
        ),
    },
)
async def list_scheduled_messages(
    channel_id: str,
    rt: RuntimeDep,
    _read: ChannelReaderDep,
    cursor: CursorDep,
    read: ReadNoteDep,
    status: StatusQuery = None,
) -> JSONResponse:
    due = status_filter(status, SCHEDULE_FILTER)
    page = await rt.messages.list(channel_id, cursor, scheduled_only=True, due=due)
    urls = [views.scheduled_message_path(channel_id, m.message_id) for m in page.items]
    path = f"/channel/{views.segment(channel_id)}/scheduled-messages"
    listed = views.url_list(path, urls, page)
    body = {"result": listed["Result"], "pages": listed["Pages"]}
    return JSONResponse(body, headers=read.header)


@router.delete(
    "/channel/{channel_id}/scheduled-message/{message_id:path}",
    status_code=204,
    response_class=Response,
    responses={
        204: answer("cancelled, with its jobs"),
        **errors(
            PRODUCER,
            {404: "no such scheduled message", 409: "its time has come: it is dispatched"},
            DATABASE,
        ),
    },
)
async def cancel_scheduled_message(
    channel_id: str,
    message_id: str,
    rt: RuntimeDep,
    channel_token: Annotated[str | None, Header(alias="X-Broker-Channel-Token")] = None,
    producer_id: Annotated[str | None, Header(alias="X-Broker-Producer-ID")] = None,
    producer_token: Annotated[str | None, Header(alias="X-Broker-Producer-Token")] = None,
) -> Response:
    """Cancel a scheduled message before its time: it and its jobs are gone (409 after)."""
    digest = rt.tokens.digest.optional
    credentials = (digest(channel_token), producer_id, digest(producer_token))
    await rt.messages.cancel_scheduled(channel_id, message_id, credentials)
    return Response(status_code=204)


@router.get(
    "/channel/{channel_id}/scheduled-message/{message_id:path}",
    response_model=schemas.ScheduledMessage,
    responses={
        200: answer("the scheduled message", READ_FROM),
        **errors({404: "no such message, or it was not scheduled"}, DATABASE),
    },
)
async def get_scheduled_message(
    channel_id: str, message_id: str, rt: RuntimeDep, _read: ChannelReaderDep, read: ReadNoteDep
) -> JSONResponse:
    """A scheduled message, with the Go original's field names."""
    message, _ = await rt.messages.get(channel_id, message_id)
    if message.scheduled_for is None:
        raise NotFound(f"message {message_id!r} of channel {channel_id!r} was not scheduled")
    return JSONResponse(views.scheduled_message(message, datetime.now(UTC)), headers=read.header)


@router.get(
    "/channel/{channel_id}/messages",
    response_model=schemas.Links,
    responses={
        200: answer("a page of message links, newest first", READ_FROM),
        **errors(
            CURSOR, {400: "status is not ACKNOWLEDGED, DISPATCHED, 101 or 102"}, CHANNEL, DATABASE
        ),
    },
)
async def list_messages(
    channel_id: str,
    rt: RuntimeDep,
    _read: ChannelReaderDep,
    cursor: CursorDep,
    read: ReadNoteDep,
    status: StatusQuery = None,
) -> JSONResponse:
    """The channel's messages, newest first; `status` as the Go original's (repeatable)."""
    page = await rt.messages.list(channel_id, cursor, due=status_filter(status, MESSAGE_FILTER))
    urls = [views.message_path(channel_id, item.message_id) for item in page.items]
    path = f"/channel/{views.segment(channel_id)}/messages"
    return JSONResponse(views.url_list(path, urls, page), headers=read.header)


# Message ids come from a header and may contain '/': the last parameter takes the rest.
@router.get(
    "/channel/{channel_id}/message/{message_id:path}",
    response_model=schemas.Message,
    responses={
        200: answer("the message and its jobs", READ_FROM),
        **errors({404: "no such message in the channel"}, DATABASE),
    },
)
async def get_message(
    channel_id: str, message_id: str, rt: RuntimeDep, _read: ChannelReaderDep, read: ReadNoteDep
) -> JSONResponse:
    message, jobs = await rt.messages.get(channel_id, message_id)
    return JSONResponse(views.message(message, jobs), headers=read.header)


@router.get(
    "/channel/{channel_id}/messages-status",
    response_model=schemas.MessagesStatus,
    responses={200: answer("job counts by status", READ_FROM), **errors(CHANNEL, DATABASE)},
)
async def messages_status(
    channel_id: str, rt: RuntimeDep, _read: ChannelReaderDep, read: ReadNoteDep
) -> JSONResponse:
    counts = await rt.messages.status_counts(channel_id)
    return JSONResponse(
        {
            "Counts": {
                status: {"Count": counts.get(status, 0)}
                # SCHEDULED: those of the QUEUED jobs whose scheduled message is yet to come.
                for status in ("QUEUED", "INFLIGHT", "DELIVERED", "DEAD", "SCHEDULED")
            }
        },
        headers=read.header,
    )
