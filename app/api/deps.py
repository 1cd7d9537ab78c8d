"""Request-scoped helpers: services from app.state, credentials from headers, admin checks."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Annotated, Protocol, cast

from fastapi import Depends, Header, Request
from starlette.formparsers import FormParser, MultiPartException

from app.api.body import request_body
from app.config import Config
from app.domain.access import check_change, read_refused, read_role, stands_in
from app.domain.errors import Forbidden, InvalidInput, UnsupportedMediaType
from app.domain.models import Cursor
from app.domain.pulls import ConsumerCredentials
from app.metrics import Metrics
from app.services.acking import AckService
from app.services.admin import AdminService
from app.services.health import HealthService
from app.services.job_status import JobStatusQueries
from app.services.messages import MessageQueries
from app.services.pausing import PauseService
from app.services.pinning import PinService
from app.services.publishing import PublishingService
from app.services.pulling import PullService
from app.services.redrives import RedriveService
from app.services.seed_jobs import SeedJobService
from app.services.tokens import TokenKeys

FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"
READS = frozenset({"GET", "HEAD"})


class ApiServices(Protocol):
    """What the API needs of its process: the routes' services and the process's life cycle.
    A Protocol, so the API names no composition root (app/roots/api.ApiRoot is the one)."""

    config: Config
    tokens: TokenKeys
    metrics: Metrics
    admin: AdminService
    pins: PinService
    publishing: PublishingService
    messages: MessageQueries
    health: HealthService
    job_status: JobStatusQueries
    redrives: RedriveService
    pulls: PullService
    acks: AckService
    seed_jobs: SeedJobService
    pauses: PauseService

    @property
    def draining(self) -> bool: ...

    async def scrape(self) -> bytes: ...

    async def start(self, *, seed: bool = True) -> None: ...

    async def stop(self) -> None: ...


async def runtime(request: Request) -> ApiServices:
    # Set by create_app, typed there.
    return cast(ApiServices, request.app.state.runtime)


RuntimeDep = Annotated[ApiServices, Depends(runtime)]


async def consumer_credentials(
    request: Request,
    channel_id: str,
    consumer_id: str,
    rt: RuntimeDep,
    channel_token: Annotated[str | None, Header(alias="X-Broker-Channel-Token")] = None,
    consumer_token: Annotated[str | None, Header(alias="X-Broker-Consumer-Token")] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> ConsumerCredentials:
    # The channel token as it is stored (a keyed hash, app/domain/tokens.py).
    stored = rt.tokens.digest.optional(channel_token)
    http = rt.config.http
    # Without the consumer's tokens, an operator's bearer token may stand in for them; tokens
    # that are given are always checked.
    operator = (
        authorization is not None
        and channel_token is None
        and consumer_token is None
        and stands_in(
            authorization, http.admin_token, http.reader_token, read=request.method in READS
        )
    )
    return ConsumerCredentials(channel_id, stored, consumer_id, consumer_token, operator)


CredentialsDep = Annotated[ConsumerCredentials, Depends(consumer_credentials)]


async def cursor(next: str | None = None, previous: str | None = None) -> Cursor:
    return Cursor(next=next or None, previous=None if next else previous or None)


CursorDep = Annotated[Cursor, Depends(cursor)]


async def require_admin(
    rt: RuntimeDep,
    authorization: Annotated[str | None, Header()] = None,
) -> None:
    """With [http] admin-token set, changes to channels, producers and consumers need it."""
    http = rt.config.http
    check_change(authorization, http.admin_token, http.reader_token)


AdminDep = Annotated[None, Depends(require_admin)]


async def require_reader(
    rt: RuntimeDep,
    authorization: Annotated[str | None, Header()] = None,
) -> None:
    """Reads of every channel's data (lists, job counts): the reader or admin token, once
    either is configured ([http] anonymous-reads=true opens them again)."""
    http = rt.config.http
    role = read_role(authorization, http.admin_token, http.reader_token, guarded=http.guarded_reads)
    if role is None:
        raise read_refused(channel_scoped=False)


ReaderDep = Annotated[None, Depends(require_reader)]


async def require_channel_reader(
    channel_id: str,
    rt: RuntimeDep,
    authorization: Annotated[str | None, Header()] = None,
    channel_token: Annotated[str | None, Header(alias="X-Broker-Channel-Token")] = None,
) -> None:
    """Reads of one channel's data (its messages, consumers): the reader or admin token, or the
    channel's own token."""
    http = rt.config.http
    if not http.guarded_reads:
        return
    if channel_token is not None:  # given, it is checked, whatever else is
        if not await rt.admin.channel_token_matches(channel_id, rt.tokens.digest(channel_token)):
            raise Forbidden("channel token does not match")
        return
    if read_role(authorization, http.admin_token, http.reader_token, guarded=True) is None:
        raise read_refused(channel_scoped=True)


ChannelReaderDep = Annotated[None, Depends(require_channel_reader)]


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
