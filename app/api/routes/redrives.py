"""Redrives of a consumer's dead (or delivered) jobs: start, watch, list, cancel."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api import schemas, views
from app.api.body import body_after_credentials, request_body
from app.api.deps import CredentialsDep, RuntimeDep
from app.api.openapi import CONSUMER, DATABASE, JSON_BODY, answer, errors, json_body
from app.api.responses import JSONResponse
from app.domain.errors import InvalidInput
from app.domain.jobs import JobStatus
from app.domain.pulls import ConsumerCredentials
from app.domain.redrives import RedriveRequest

router = APIRouter(tags=["redrives"])

BASE = "/channel/{channel_id}/consumer/{consumer_id}/redrives"


def _redrive_id(raw: str) -> int:
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise InvalidInput("a redrive id is a number")
    return int(raw)


def _base(creds: ConsumerCredentials) -> str:
    return views.consumer_path(creds.channel_id, creds.consumer_id) + "/redrives"


@router.post(
    BASE,
    status_code=202,
    response_model=schemas.Redrive,
    responses={202: answer("started", "Location"), **errors(JSON_BODY, CONSUMER, DATABASE)},
    openapi_extra=json_body(schemas.RedriveBody, required=False),
)
async def start_redrive(creds: CredentialsDep, rt: RuntimeDep, request: Request) -> JSONResponse:
    """Move the consumer's DEAD jobs (or DELIVERED ones, `"from": "DELIVERED"`, to replay)
    that reached that state in [since, until) back to QUEUED, `perSecond` at most (default
    500), in the background."""

    async def parse() -> RedriveRequest:
        body = schemas.parse(schemas.RedriveBody, await request_body(request), empty_ok=True)
        return RedriveRequest(JobStatus(body.from_), body.since, body.until, body.perSecond)

    asked = await body_after_credentials(request, parse, lambda: rt.redrives.check(creds))
    started = await rt.redrives.start(creds, asked)
    location = f"{_base(creds)}/{started.id}"
    return JSONResponse(
        views.redrive(started, location), status_code=202, headers={"Location": location}
    )


@router.get(
    BASE,
    response_model=schemas.Redrives,
    responses={
        200: answer("the newest redrives, newest first"),
        **errors(CONSUMER, DATABASE),
    },
)
async def list_redrives(creds: CredentialsDep, rt: RuntimeDep) -> JSONResponse:
    """The consumer's newest redrives, newest first."""
    base = _base(creds)
    found = await rt.redrives.list(creds)
    return JSONResponse({"Result": [views.redrive(r, f"{base}/{r.id}") for r in found]})


@router.get(
    BASE + "/{redrive_id}",
    response_model=schemas.Redrive,
    responses={
        200: answer("the redrive"),
        **errors(
            {400: "the redrive id is not a number", 404: "no such redrive"}, CONSUMER, DATABASE
        ),
    },
)
async def get_redrive(redrive_id: str, creds: CredentialsDep, rt: RuntimeDep) -> JSONResponse:
    found = await rt.redrives.get(creds, _redrive_id(redrive_id))
    return JSONResponse(views.redrive(found, f"{_base(creds)}/{found.id}"))


@router.delete(
    BASE + "/{redrive_id}",
    response_model=schemas.Redrive,
    responses={
        200: answer("stopped where it was"),
        **errors(
            {
                400: "the redrive id is not a number",
                404: "no such redrive",
                409: "the redrive has finished",
            },
            CONSUMER,
            DATABASE,
        ),
    },
)
async def cancel_redrive(redrive_id: str, creds: CredentialsDep, rt: RuntimeDep) -> JSONResponse:
    """Stop a running redrive where it is (409 once it has finished)."""
    cancelled = await rt.redrives.cancel(creds, _redrive_id(redrive_id))
    return JSONResponse(views.redrive(cancelled, f"{_base(creds)}/{cancelled.id}"))
