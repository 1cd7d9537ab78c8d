"""Producers and channels: PUT (form), GET, and keyset-paginated lists."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header

from app.api import schemas, views
from app.api.deps import (
    AdminDep,
    ChannelReaderDep,
    CursorDep,
    FormDep,
    ReaderDep,
    RuntimeDep,
)
from app.api.openapi import CHANGE, CHANNEL, CURSOR, DATABASE, FORM, answer, errors, form_body
from app.api.reads import READ_FROM, ReadNoteDep
from app.api.responses import JSONResponse
from app.domain.models import Stakeholder
from app.services.admin import http_date

router = APIRouter(tags=["management"])

UnmodifiedSince = Annotated[str | None, Header(alias="If-Unmodified-Since")]


def _one(item: Stakeholder, *, with_token: bool = False) -> JSONResponse:
    return JSONResponse(
        views.stakeholder(item, with_token=with_token),
        headers={"Last-Modified": http_date(item.updated_at)},
    )


@router.put(
    "/producer/{producer_id}",
    response_model=schemas.Stakeholder,
    responses={
        200: answer("created or changed", "Last-Modified"),
        **errors(FORM, CHANGE, DATABASE),
    },
    openapi_extra=form_body(schemas.StakeholderForm),
)
async def put_producer(
    producer_id: str, rt: RuntimeDep, _: AdminDep, form: FormDep, since: UnmodifiedSince = None
) -> JSONResponse:
    item = await rt.admin.put_stakeholder(
        "producer", producer_id, form.get("token"), form.get("name"), since
    )
    return _one(item, with_token=True)


@router.get(
    "/producer/{producer_id}",
    response_model=schemas.Stakeholder,
    responses={
        200: answer("the producer", "Last-Modified"),
        **errors({404: "no such producer"}, DATABASE),
    },
)
async def get_producer(producer_id: str, rt: RuntimeDep, _read: ReaderDep) -> JSONResponse:
    return _one(await rt.admin.get_stakeholder("producer", producer_id))


@router.get(
    "/producers",
    response_model=schemas.Links,
    responses={
        200: answer("a page of producer links", READ_FROM),
        **errors(CURSOR, DATABASE),
    },
)
async def list_producers(
    rt: RuntimeDep, _read: ReaderDep, cursor: CursorDep, read: ReadNoteDep
) -> JSONResponse:
    page = await rt.admin.list_stakeholders("producer", cursor)
    urls = [views.stakeholder_path("producer", item.id) for item in page.items]
    return JSONResponse(views.url_list("/producers", urls, page), headers=read.header)


@router.put(
    "/channel/{channel_id}",
    response_model=schemas.Stakeholder,
    responses={
        200: answer("created or changed", "Last-Modified"),
        **errors(FORM, CHANGE, DATABASE),
    },
    openapi_extra=form_body(schemas.StakeholderForm),
)
async def put_channel(
    channel_id: str, rt: RuntimeDep, _: AdminDep, form: FormDep, since: UnmodifiedSince = None
) -> JSONResponse:
    item = await rt.admin.put_stakeholder(
        "channel", channel_id, form.get("token"), form.get("name"), since
    )
    return _one(item, with_token=True)


@router.get(
    "/channel/{channel_id}",
    response_model=schemas.Stakeholder,
    responses={200: answer("the channel", "Last-Modified"), **errors(CHANNEL, DATABASE)},
)
async def get_channel(channel_id: str, rt: RuntimeDep, _read: ChannelReaderDep) -> JSONResponse:
    return _one(await rt.admin.get_stakeholder("channel", channel_id))


@router.get(
    "/channels",
    response_model=schemas.Links,
    responses={
        200: answer("a page of channel links", READ_FROM),
        **errors(CURSOR, DATABASE),
    },
)
async def list_channels(
    rt: RuntimeDep, _read: ReaderDep, cursor: CursorDep, read: ReadNoteDep
) -> JSONResponse:
    page = await rt.admin.list_stakeholders("channel", cursor)
    urls = [views.stakeholder_path("channel", item.id) for item in page.items]
    return JSONResponse(views.url_list("/channels", urls, page), headers=read.header)
