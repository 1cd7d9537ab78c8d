"""Redrives of a consumer's dead (or delivered) jobs: start, watch, list, cancel."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api import views
from app.api.body import body_after_credentials, json_object
from app.api.deps import CredentialsDep, RuntimeDep
from app.api.responses import JSONResponse
from app.domain.errors import InvalidInput
from app.domain.pulls import ConsumerCredentials
from app.domain.redrives import RedriveRequest, parse_redrive_request

router = APIRouter(tags=["redrives"])

BASE = "/channel/{channel_id}/consumer/{consumer_id}/redrives"


def _redrive_id(raw: str) -> int:
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise InvalidInput("a redrive id is a number")
    return int(raw)


def _base(creds: ConsumerCredentials) -> str:
    return views.consumer_path(creds.channel_id, creds.consumer_id) + "/redrives"


@router.post(BASE, status_code=202)
async def start_redrive(creds: CredentialsDep, rt: RuntimeDep, request: Request) -> JSONResponse:
    """Move the consumer's DEAD jobs (or DELIVERED ones, `"from": "DELIVERED"`, to replay)
    that reached that state in [since, until) back to QUEUED, `perSecond` at most (default
    500), in the background."""

    async def parse() -> RedriveRequest:
        return parse_redrive_request(await json_object(request, empty_ok=True))

    asked = await body_after_credentials(request, parse, lambda: rt.redrives.check(creds))
    started = await rt.redrives.start(creds, asked)
    location = f"{_base(creds)}/{started.id}"
    return JSONResponse(
        views.redrive(started, location), status_code=202, headers={"Location": location}
    )


@router.get(BASE)
async def list_redrives(creds: CredentialsDep, rt: RuntimeDep) -> JSONResponse:
    """The consumer's newest redrives, newest first."""
    base = _base(creds)
    found = await rt.redrives.list(creds)
    return JSONResponse({"Result": [views.redrive(r, f"{base}/{r.id}") for r in found]})


@router.get(BASE + "/{redrive_id}")
async def get_redrive(redrive_id: str, creds: CredentialsDep, rt: RuntimeDep) -> JSONResponse:
    found = await rt.redrives.get(creds, _redrive_id(redrive_id))
    return JSONResponse(views.redrive(found, f"{_base(creds)}/{found.id}"))


@router.delete(BASE + "/{redrive_id}")
async def cancel_redrive(redrive_id: str, creds: CredentialsDep, rt: RuntimeDep) -> JSONResponse:
    """Stop a running redrive where it is (409 once it has finished)."""
    cancelled = await rt.redrives.cancel(creds, _redrive_id(redrive_id))
    return JSONResponse(views.redrive(cancelled, f"{_base(creds)}/{cancelled.id}"))
