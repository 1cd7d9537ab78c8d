"""Request-scoped helpers: services from app.state, credentials from headers, admin checks."""

from __future__ import annotations

import hmac
from collections.abc import AsyncGenerator
from typing import Annotated

from fastapi import Depends, Header, Request
from starlette.formparsers import FormParser, MultiPartException

from app.api.body import request_body
from app.domain.errors import Forbidden, InvalidInput, Unauthenticated, UnsupportedMediaType
from app.domain.models import Cursor
from app.domain.pulls import ConsumerCredentials
from app.runtime import Runtime

FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"


async def runtime(request: Request) -> Runtime:
    rt = request.app.state.runtime
    assert isinstance(rt, Runtime)
    return rt


RuntimeDep = Annotated[Runtime, Depends(runtime)]


async def consumer_credentials(
    channel_id: str,
    consumer_id: str,
    channel_token: Annotated[str | None, Header(alias="X-Broker-Channel-Token")] = None,
    consumer_token: Annotated[str | None, Header(alias="X-Broker-Consumer-Token")] = None,
) -> ConsumerCredentials:
    return ConsumerCredentials(channel_id, channel_token, consumer_id, consumer_token)


CredentialsDep = Annotated[ConsumerCredentials, Depends(consumer_credentials)]


async def cursor(next: str | None = None, previous: str | None = None) -> Cursor:
    return Cursor(next=next or None, previous=None if next else previous or None)


CursorDep = Annotated[Cursor, Depends(cursor)]


async def require_admin(
    rt: RuntimeDep,
    authorization: Annotated[str | None, Header()] = None,
) -> None:
    """With [http] admin-token set, changes to channels, producers and consumers need it."""
    expected = rt.config.http.admin_token
    if not expected:
        return
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthenticated("this change needs Authorization: Bearer <admin-token>")
    given = authorization[7:].strip().encode()
    # A secret from the configuration, not the database: compared here, in constant time.
    if not hmac.compare_digest(given, expected.encode()):
        raise Forbidden("the admin token does not match")


AdminDep = Annotated[None, Depends(require_admin)]


async def form_fields(request: Request) -> dict[str, str]:
    """The form body of a management PUT; anything but a urlencoded form is a 415. It is read
    after the admin check (AdminDep comes first in every route that takes it), at most
    [http] max-body-bytes of it."""
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type != FORM_CONTENT_TYPE:
        raise UnsupportedMediaType(f"send the fields as {FORM_CONTENT_TYPE}")
    return await urlencoded_form(request)


async def urlencoded_form(request: Request) -> dict[str, str]:
    """A urlencoded body, read through the one bounded reader and parsed as Starlette would
    (the last value of a repeated field wins)."""
    raw = await request_body(request)

    async def once() -> AsyncGenerator[bytes, None]:
        yield raw

    try:
        form = await FormParser(request.headers, once()).parse()
    except MultiPartException as exc:
        raise InvalidInput(f"malformed form: {exc.message}") from None
    return {key: value for key, value in form.items() if isinstance(value, str)}


FormDep = Annotated[dict[str, str], Depends(form_fields)]
