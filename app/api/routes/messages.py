"""Publishing (broadcast) and reading a channel's messages."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request, Response

from app.api import views
from app.api.deps import CursorDep, RuntimeDep
from app.api.responses import JSONResponse
from app.domain.errors import NotFound, PayloadTooLarge
from app.services.publishing import Broadcast

router = APIRouter(tags=["messages"])


@router.post("/channel/{channel_id}/broadcast", status_code=201)
async def broadcast(channel_id: str, request: Request, rt: RuntimeDep) -> Response:
    limit = rt.config.broker.max_message_size_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the message body is {declared} bytes; the limit is {limit}")
    headers = request.headers
    message = await rt.publishing.publish(
        channel_id,
        Broadcast(
            channel_token=headers.get("X-Broker-Channel-Token"),
            producer_id=headers.get("X-Broker-Producer-ID"),
            producer_token=headers.get("X-Broker-Producer-Token"),
            payload=await request.body(),
            content_type=headers.get("Content-Type"),
            priority=headers.get("X-Broker-Message-Priority"),
            message_id=headers.get("X-Broker-Message-ID"),
            metadata_header_names=headers.get("X-Broker-Metadata-Headers"),
            headers=headers,
            scheduled_for=headers.get("X-Broker-Scheduled-For"),
        ),
    )
    if message.scheduled_for is not None:
        location = views.scheduled_message_path(channel_id, message.message_id)
    else:
        location = views.message_path(channel_id, message.message_id)
    return Response(status_code=201, headers={"Location": location})


@router.get("/channel/{channel_id}/scheduled-message/{message_id:path}")
async def get_scheduled_message(channel_id: str, message_id: str, rt: RuntimeDep) -> JSONResponse:
    """A scheduled message, with the Go original's field names."""
    message, _ = await rt.messages.get(channel_id, message_id)
    if message.scheduled_for is None:
        raise NotFound(f"message {message_id!r} of channel {channel_id!r} was not scheduled")
    return JSONResponse(views.scheduled_message(message, datetime.now(UTC)))


@router.get("/channel/{channel_id}/messages")
async def list_messages(channel_id: str, rt: RuntimeDep, cursor: CursorDep) -> JSONResponse:
    page = await rt.messages.list(channel_id, cursor)
    urls = [views.message_path(channel_id, item.message_id) for item in page.items]
    path = f"/channel/{views.segment(channel_id)}/messages"
    return JSONResponse(views.url_list(path, urls, page))


# Message ids come from a header and may contain '/': the last parameter takes the rest.
@router.get("/channel/{channel_id}/message/{message_id:path}")
async def get_message(channel_id: str, message_id: str, rt: RuntimeDep) -> JSONResponse:
    message, jobs = await rt.messages.get(channel_id, message_id)
    return JSONResponse(views.message(message, jobs))


@router.get("/channel/{channel_id}/messages-status")
async def messages_status(channel_id: str, rt: RuntimeDep) -> JSONResponse:
    counts = await rt.messages.status_counts(channel_id)
    return JSONResponse(
        {
            "Counts": {
                status: {"Count": counts.get(status, 0)}
                for status in ("QUEUED", "INFLIGHT", "DELIVERED", "DEAD")
            }
        }
    )
