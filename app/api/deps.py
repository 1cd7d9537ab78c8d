"""Request-scoped helpers: services from app.state, credentials from headers, admin checks."""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Annotated, Any, Protocol, cast

from fastapi import Depends, Header, Request, routing
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.formparsers import FormParser, MultiPartException
from starlette.responses import Response

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


def runtime_of(request: Request) -> ApiServices:
    # Set by create_app, typed there.
    return cast(ApiServices, request.app.state.runtime)


async def runtime(request: Request) -> ApiServices:
    return runtime_of(request)


RuntimeDep = Annotated[ApiServices, Depends(runtime)]


def credentials_of(request: Request) -> ConsumerCredentials:
    """A pull consumer's credentials from the path and the headers consumer_credentials
    declares (the one reading of them, with or without FastAPI's injection)."""
    rt = runtime_of(request)
    headers = request.headers
    channel_token = headers.get("X-Broker-Channel-Token")
    consumer_token = headers.get("X-Broker-Consumer-Token")
    authorization = headers.get("Authorization")
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
    params = request.path_params
    return ConsumerCredentials(
        params["channel_id"], stored, params["consumer_id"], consumer_token, operator
    )


async def consumer_credentials(
    request: Request,
    channel_id: str,
    consumer_id: str,
    rt: RuntimeDep,
    channel_token: Annotated[str | None, Header(alias="X-Broker-Channel-Token")] = None,
    consumer_token: Annotated[str | None, Header(alias="X-Broker-Consumer-Token")] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> ConsumerCredentials:
    """The parameters say what the OpenAPI document shows; credentials_of reads them."""
    return credentials_of(request)


CredentialsDep = Annotated[ConsumerCredentials, Depends(consumer_credentials)]

# Dependencies a BoundRoute computes straight from the request (each is the function its
# dependency returns the result of).
PLAIN: dict[Callable[..., Any], Callable[[Request], Any]] = {
    runtime: runtime_of,
    consumer_credentials: credentials_of,
}

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class BoundRoute(APIRoute):
    """A route whose arguments are bound once, when the route is made: the request, its path
    parameters (strings) and the PLAIN dependencies. FastAPI's per-request dependency
    solving cost a hot route (an ack) an eighth of the API's CPU; declarations, and so the
    OpenAPI document, stay as they are. A route taking anything else (a query, a header, a
    body parameter, another dependency) is handled by FastAPI as before."""

    def get_route_handler(self) -> Handler:
        binders = _binders(self)
        if binders is None:
            return super().get_route_handler()
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            response = await endpoint(**{name: bind(request) for name, bind in binders})
            assert isinstance(response, Response)  # the routes answer with Responses
            return response

        return handler


def _path_param(name: str) -> Callable[[Request], Any]:
    return lambda request: request.path_params[name]


def _request(request: Request) -> Request:
    return request


def _binders(route: APIRoute) -> list[tuple[str, Callable[[Request], Any]]] | None:
    """How to compute each of the endpoint's arguments from the request; None if one of
    them needs FastAPI."""
    dependant: Dependant = route.dependant
    # A route included in a router is handled as FastAPI's effective route: its dependant
    # has the including routers' dependencies too.
    context = getattr(routing, "_effective_route_context_var", None)
    current = context.get() if context is not None else None
    if current is not None and getattr(current, "original_route", None) is route:
        dependant = current.dependant
        if not isinstance(dependant, Dependant):
            return None
    if not inspect.iscoroutinefunction(route.endpoint) or any(
        (
            dependant.query_params,
            dependant.header_params,
            dependant.cookie_params,
            dependant.body_params,
            dependant.websocket_param_name,
            dependant.http_connection_param_name,
            dependant.response_param_name,
            dependant.background_tasks_param_name,
            dependant.security_scopes_param_name,
        )
    ):
        return None
    binders: list[tuple[str, Callable[[Request], Any]]] = []
    if dependant.request_param_name:
        binders.append((dependant.request_param_name, _request))
    for field in dependant.path_params:
        if field.field_info.annotation is not str:
            return None
        binders.append((field.name, _path_param(field.alias)))
    for sub in dependant.dependencies:
        plain = PLAIN.get(sub.call) if sub.call is not None else None
        if plain is None or sub.name is None:
            return None
        binders.append((sub.name, plain))
    return binders


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
