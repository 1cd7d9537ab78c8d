"""Consumers of a channel: PUT (form), GET, DELETE, the channel's consumer list, and a
consumer's pause (PUT .../pause, DELETE .../pause to resume)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from app.api import schemas, views
from app.api.body import request_body
from app.api.deps import (
    FORM_CONTENT_TYPE,
    AdminDep,
    ChannelReaderDep,
    CursorDep,
    FormDep,
    RuntimeDep,
    urlencoded_form,
)
from app.api.openapi import CHANGE, CHANNEL, CURSOR, DATABASE, FORM, answer, errors, form_body
from app.api.reads import READ_FROM, ReadNoteDep
from app.api.responses import JSONResponse
from app.api.routes.stakeholders import UnmodifiedSince
from app.domain.errors import InvalidInput, UnsupportedMediaType
from app.domain.models import Consumer
from app.domain.times import utc_moment
from app.services.admin import ConsumerForm, http_date

router = APIRouter(tags=["management"])


async def _one(rt: RuntimeDep, item: Consumer, *, with_token: bool = False) -> JSONResponse:
    body = views.consumer(
        item,
        default_ack_wait=rt.config.default_ack_wait_seconds,
        default_max_in_flight=rt.config.push.max_in_flight,
        state=await rt.admin.push_state(item),
        with_token=with_token,
    )
    return JSONResponse(body, headers={"Last-Modified": http_date(item.updated_at)})


@router.put(
    "/channel/{channel_id}/consumer/{consumer_id}",
    response_model=schemas.Consumer,
    responses={
        200: answer("created or changed", "Last-Modified"),
        **errors(FORM, CHANGE, CHANNEL, DATABASE),
    },
    openapi_extra=form_body(schemas.ConsumerForm),
)
async def put_consumer(
    channel_id: str,
    consumer_id: str,
    rt: RuntimeDep,
    _: AdminDep,
    form: FormDep,
    since: UnmodifiedSince = None,
) -> JSONResponse:
    fields = ConsumerForm(
        token=form.get("token"),
        name=form.get("name"),
        callback_url=form.get("callbackUrl"),
        type=form.get("type"),
        ack_wait=form.get("ackWait"),
        max_ack_pending=form.get("maxAckPending"),
        priority_groups=form.get("priorityGroups"),
        priority_policy=form.get("priorityPolicy"),
        priority_timeout=form.get("priorityTimeout"),
        max_in_flight=form.get("maxInFlight"),
        rate_limit=form.get("rateLimit"),
        signing_secret=form.get("signingSecret"),
        signing_secret_overlap=form.get("signingSecretOverlap"),
        enabled=form.get("enabled"),
    )
    item = await rt.admin.put_consumer(channel_id, consumer_id, fields, since)
    return await _one(rt, item, with_token=True)


@router.get(
    "/channel/{channel_id}/consumer/{consumer_id}",
    response_model=schemas.Consumer,
    responses={
        200: answer("the consumer", "Last-Modified"),
        **errors({404: "no such channel or consumer"}, DATABASE),
    },
)
async def get_consumer(
    channel_id: str, consumer_id: str, rt: RuntimeDep, _read: ChannelReaderDep
) -> JSONResponse:
    return await _one(rt, await rt.admin.get_consumer(channel_id, consumer_id))


@router.delete(
    "/channel/{channel_id}/consumer/{consumer_id}",
    status_code=204,
    response_class=Response,
    responses={
        204: answer("deleted, with its jobs"),
        **errors(CHANGE, {404: "no such channel or consumer"}, DATABASE),
    },
)
async def delete_consumer(
    channel_id: str, consumer_id: str, rt: RuntimeDep, _: AdminDep, since: UnmodifiedSince = None
) -> Response:
    await rt.admin.delete_consumer(channel_id, consumer_id, since)
    return Response(status_code=204)


@router.get(
    "/channel/{channel_id}/consumers",
    response_model=schemas.Links,
    responses={
        200: answer("a page of consumer links", READ_FROM),
        **errors(CURSOR, CHANNEL, DATABASE),
    },
)
async def list_consumers(
    channel_id: str, rt: RuntimeDep, _read: ChannelReaderDep, cursor: CursorDep, read: ReadNoteDep
) -> JSONResponse:
    page = await rt.admin.list_consumers(channel_id, cursor)
    urls = [views.consumer_path(channel_id, item.id) for item in page.items]
    path = f"/channel/{views.segment(channel_id)}/consumers"
    return JSONResponse(views.url_list(path, urls, page), headers=read.header)


async def pause_fields(request: Request) -> dict[str, str]:
    """A pause's optional form; no body at all pauses until resumed. Read after the admin
    check, as FormDep."""
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type == FORM_CONTENT_TYPE:
        return await urlencoded_form(request)
    if await request_body(request):
        raise UnsupportedMediaType(f"send the fields as {FORM_CONTENT_TYPE}, or no body")
    return {}


PauseFormDep = Annotated[dict[str, str], Depends(pause_fields)]
PAUSE_FORM = {400: "until is not an RFC 3339 time with an offset", **FORM}


@router.put(
    "/channel/{channel_id}/consumer/{consumer_id}/pause",
    response_model=schemas.Consumer,
    responses={
        200: answer("paused: claims and pushes stop, publishes are still stored", "Last-Modified"),
        **errors(PAUSE_FORM, {404: "no such channel or consumer"}, DATABASE),
    },
    openapi_extra=form_body(schemas.PauseForm, required=False),
)
async def pause_consumer(
    channel_id: str, consumer_id: str, rt: RuntimeDep, _: AdminDep, form: PauseFormDep
) -> JSONResponse:
    raw = form.get("until")
    until = None
    if raw:
        until = utc_moment(raw)
        if until is None:
            raise InvalidInput("until must be an RFC 3339 time with an offset")
    return await _one(rt, await rt.pauses.pause(channel_id, consumer_id, until))


@router.delete(
    "/channel/{channel_id}/consumer/{consumer_id}/pause",
    response_model=schemas.Consumer,
    responses={
        200: answer("resumed: waiting pulls and the dispatchers claim at once", "Last-Modified"),
        **errors({404: "no such channel or consumer"}, DATABASE),
    },
)
async def resume_consumer(
    channel_id: str, consumer_id: str, rt: RuntimeDep, _: AdminDep
) -> JSONResponse:
    return await _one(rt, await rt.pauses.resume(channel_id, consumer_id))
