"""The console's pages and actions (server-rendered; htmx for the live table and the redrive's
progress). Every action is a GET of its confirmation (how many jobs it touches) and a POST of
that form, which carries the session's CSRF token; the reader's session sees every page and
neither the actions nor their confirmations, and its POSTs are refused."""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.templating import Jinja2Templates

from app.api.deps import ApiServices, urlencoded_form
from app.api.errors import status_for
from app.domain.console import (
    BULK_LIMIT,
    PAYLOAD_BUDGET,
    SCAN_ROWS,
    JobFilter,
    parse_job_filter,
)
from app.domain.errors import BrokerError, Forbidden, InvalidInput, NotFound, Unauthenticated
from app.domain.jobs import JobStatus
from app.domain.pulls import ConsumerCredentials
from app.domain.redrives import DEFAULT_PER_SECOND, MAX_PER_SECOND, RedriveRequest
from app.services.console import ConsoleService
from app.services.pausing import FOREVER
from app.services.signals import Signals
from app.ui.live import LiveFull, LiveOverview, Series, Snapshot
from app.ui.sessions import (
    COOKIE,
    LIFETIME_SECONDS,
    PRE_COOKIE,
    FailedSignIns,
    Session,
    Sessions,
)

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")

ACTIONS = {
    "requeue-job": "Requeue this dead job",
    "delete-job": "Delete this dead job",
    "requeue-matching": "Requeue every dead job the filter matches",
    "delete-matching": "Delete every dead job the filter matches",
    "redrive-matching": "Redrive every job the filter matches, at a rate",
    "purge-dlq": "Delete every dead job of the consumer (purge the DLQ)",
    "unpin": "Unpin the priority group's pinned client",
    "reset-breaker": "Reset the push breaker (and enable the endpoint again)",
    "pause": "Pause the consumer: claims and pushes stop, publishes are still stored",
    "resume": "Resume the consumer: waiting pulls and the dispatchers claim at once",
}
# What an action's redirect may say on the page it lands on: a code and a number in the query,
# never text from it (a link could otherwise put any sentence on a console page).
DONE = {
    "job-requeued": "job {n} requeued",
    "job-deleted": "job {n} deleted",
    "requeued": "{n} jobs requeued",
    "deleted": "{n} jobs deleted",
    "purged": "{n} dead jobs deleted",
    "unpinned": "the priority group's pinned client unpinned",
    "not-pinned": "the priority group had no pinned client",
    "breaker-reset": "breaker reset",
    "breaker-closed": "the breaker was closed already",
    "paused": "paused until resumed",
    "resumed": "resumed",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


class ConsoleServices(ApiServices, Protocol):
    """What the console needs of the API process beyond the API's services."""

    console: ConsoleService
    signals: Signals


class Console:
    """The console's state in one API process: sessions and the live overview."""

    def __init__(self, rt: ConsoleServices) -> None:
        self.rt = rt
        self.sessions = Sessions(rt.config)
        http = rt.config.http
        # Each open page holds one of the listener's connections for as long as it is open.
        self.live = LiveOverview(
            rt.console, rt.signals, render_rows, max_pages=max_live_pages(http.max_concurrency)
        )
        self.failures = FailedSignIns()
        self.hosts = loopback_hosts(http.host)


MAX_LIVE_PAGES = 64
KEEP_ALIVE = 15.0


def max_live_pages(max_concurrency: int) -> int:
    """Open overview pages per API process: MAX_LIVE_PAGES, and never more than a quarter of
    the connections the listener serves, so pages left open cannot crowd out the API."""
    return max(1, min(MAX_LIVE_PAGES, max_concurrency // 4))


def loopback_hosts(listener_host: str) -> frozenset[str]:
    """The Host names an open console answers: the loopback names, and the listener's own
    address when it is a loopback one (127.0.0.2)."""
    names = {"localhost", "127.0.0.1", "[::1]"}
    host = listener_host.strip("[]").lower()
    if host and host != "localhost":
        names.add(f"[{host}]" if ":" in host else host)
    return frozenset(names)


def host_allowed(value: str, names: frozenset[str]) -> bool:
    """Whether a Host header names one of these hosts, with or without a port. A page served
    from another name that resolves to 127.0.0.1 (DNS rebinding) sends that other name."""
    host = value.strip().lower()
    name, port = host, ""
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return False
        name, rest = host[: end + 1], host[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                return False
            port = rest[1:]
            if not port:
                return False
    elif ":" in host:
        name, _, port = host.partition(":")
        if not port:
            return False
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5):
        return False
    return name in names


class _Refused(Exception):
    """A refusal the API's errors have no status for (429, 503), shown as the error page."""

    def __init__(self, status: int, detail: str, retry_after: int) -> None:
        self.status = status
        self.detail = detail
        self.retry_after = retry_after


def console_of(request: Request) -> Console:
    found = getattr(request.app.state, "console", None)
    if found is None:
        found = Console(cast(ConsoleServices, request.app.state.runtime))
        request.app.state.console = found
    return cast(Console, found)


class _SignIn(Exception):
    def __init__(self, path: str) -> None:
        self.path = path


class ConsoleRoute(APIRoute):
    """Refusals and errors as pages (the API's are JSON), and the security headers."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                console = console_of(request)
                if console.sessions.open and not host_allowed(
                    request.headers.get("host", ""), console.hosts
                ):
                    # With no token, signing in needs nothing but reaching the listener: only a
                    # request to a loopback name may, not a page that rebound its own name here.
                    raise Forbidden(
                        "this console has no token and answers only requests to localhost, "
                        "127.0.0.1 or [::1]; set [http] admin-token to reach it by another name"
                    )
                response = await handler(request)
            except _Refused as exc:
                response = _page(
                    request,
                    "error.html",
                    {"status": exc.status, "detail": exc.detail},
                    status_code=exc.status,
                )
                response.headers["Retry-After"] = str(exc.retry_after)
            except _SignIn as exc:
                target = "/ui/signin?" + urlencode({"next": exc.path})
                response = RedirectResponse(target, status_code=303)
            except BrokerError as exc:
                response = _page(
                    request,
                    "error.html",
                    {"status": status_for(exc), "detail": exc.detail},
                    status_code=status_for(exc),
                )
            response.headers.update(SECURITY_HEADERS)
            return response

        return guarded


router = APIRouter(prefix="/ui", route_class=ConsoleRoute, include_in_schema=False)


def _page(
    request: Request, name: str, context: dict[str, Any], *, status_code: int = 200
) -> Response:
    session = getattr(request.state, "console_session", None)
    base = {"actor": session.actor if session else None, "csrf": session.csrf if session else ""}
    return templates.TemplateResponse(
        request, name, {**base, **context, "now": datetime.now(UTC)}, status_code=status_code
    )


def _viewer(request: Request) -> Session:
    """The signed-in session; pages send the others to the sign-in form."""
    found = console_of(request).sessions.read(request.cookies.get(COOKIE))
    if found is None:
        if request.method == "GET":
            raise _SignIn(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        raise Unauthenticated("sign in to the console first")
    request.state.console_session = found
    return found


def _admin(request: Request) -> Session:
    session = _viewer(request)
    if not session.actor.can_act:
        raise Forbidden("the reader token allows reads only")
    return session


async def _posted(request: Request) -> tuple[Session, dict[str, str]]:
    """An action's form: an admin session, and its CSRF token."""
    session = _viewer(request)
    form = await urlencoded_form(request)
    given = form.get("csrf", "")
    if not given or not hmac.compare_digest(given.encode(), session.csrf.encode()):
        raise Forbidden("the form's CSRF token is missing or wrong; reload the page")
    if not session.actor.can_act:
        raise Forbidden("the reader token allows reads only")
    return session, form


def _creds(channel_id: str, consumer_id: str) -> ConsumerCredentials:
    # The signed-in admin stands in for the consumer's tokens, as the admin token does.
    return ConsumerCredentials(channel_id, None, consumer_id, None, operator=True)


def _filter(params: Mapping[str, str]) -> JobFilter:
    return parse_job_filter(
        status=params.get("status"),
        since=params.get("since"),
        until=params.get("until"),
        message_id=params.get("message_id"),
        min_attempts=params.get("min_attempts"),
        payload=params.get("payload"),
    )


def _number(raw: str | None, name: str) -> int:
    if not raw or not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise InvalidInput(f"{name} must be a number")
    return int(raw)


def done_text(params: Mapping[str, str]) -> str | None:
    """The sentence for `?done=<code>&n=<number>`; None for any other code or number."""
    text = DONE.get(params.get("done", ""))
    if text is None or "{n}" not in text:
        return text
    n = params.get("n", "")
    if not n.isascii() or not n.isdigit() or len(n) > 18:
        return None
    return text.format(n=int(n))


def _consumer_path(channel_id: str, consumer_id: str) -> str:
    return f"/ui/c/{quote(channel_id, safe='')}/{quote(consumer_id, safe='')}"


# -- sign-in ------------------------------------------------------------------------------------


def _safe_next(raw: str | None) -> str:
    # Only a path of this console: never another site.
    if raw and raw.startswith("/ui") and not raw.startswith("//"):
        return raw
    return "/ui/"


@router.get("/signin")
async def signin_form(request: Request, next: str | None = None) -> Response:
    console = console_of(request)
    token = Sessions.new_signin_token()
    response = _page(
        request,
        "signin.html",
        {"open": console.sessions.open, "signin_csrf": token, "next": _safe_next(next)},
    )
    response.set_cookie(
        PRE_COOKIE,
        token,
        max_age=600,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/ui",
    )
    return response


@router.post("/signin")
async def signin(request: Request) -> Response:
    console = console_of(request)
    form = await urlencoded_form(request)
    expected = request.cookies.get(PRE_COOKIE, "")
    given = form.get("csrf", "")
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        raise Forbidden("the sign-in form's CSRF token is missing or wrong; reload the page")
    address = request.client.host if request.client else ""
    wait = console.failures.wait(address)
    if wait > 0:
        raise _Refused(
            429,
            f"too many failed sign-ins from this address; try again in {math.ceil(wait)} seconds",
            math.ceil(wait),
        )
    if console.sessions.open:
        role: str | None = "admin"  # no token configured: the API is open to this listener
    else:
        role = console.sessions.role_of_token(form.get("token", "").strip())
    if role is None:
        console.failures.failed(address)
        return _page(
            request,
            "signin.html",
            {
                "open": False,
                "signin_csrf": expected,
                "next": _safe_next(form.get("next")),
                "refused": "That token is neither the admin nor the reader token.",
            },
            status_code=401,
        )
    cookie = console.sessions.issue(role)
    session = console.sessions.read(cookie)
    assert session is not None
    await console.rt.console.record(session.actor, "sign-in", "console", None, role)
    response = RedirectResponse(_safe_next(form.get("next")), status_code=303)
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=LIFETIME_SECONDS,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/ui",
    )
    response.delete_cookie(PRE_COOKIE, path="/ui")
    return response


@router.post("/signout")
async def signout(request: Request) -> Response:
    session = _viewer(request)
    form = await urlencoded_form(request)
    given = form.get("csrf", "")
    if not hmac.compare_digest(given.encode(), session.csrf.encode()):
        raise Forbidden("the form's CSRF token is missing or wrong; reload the page")
    await console_of(request).rt.console.record(session.actor, "sign-out", "console", None, "")
    response = RedirectResponse("/ui/signin", status_code=303)
    response.delete_cookie(COOKIE, path="/ui")
    return response


# -- overview -----------------------------------------------------------------------------------


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def pause_state(until: datetime | None, at: datetime) -> tuple[str, str] | None:
    """How a consumer's pause reads at `at`: (the end as ISO text, or "" for until resumed;
    the words after "paused"), or None when it is not paused then."""
    if until is None or until <= at:
        return None
    if until >= FOREVER:
        return "", "until resumed"
    end = until.astimezone(UTC)
    return end.isoformat(), f"until {end.strftime('%Y-%m-%d %H:%M:%S')} UTC"


def _chart(series: Series | None) -> str:
    return json.dumps([list(series.t), list(series.rate), list(series.depth)] if series else [])


def render_rows(snapshot: Snapshot, can_act: bool) -> str:
    overview = snapshot.overview
    rows = []
    for row in overview.consumers:
        key = (row.channel_id, row.consumer_id)
        series = snapshot.history.get(key)
        oldest = (overview.at - row.oldest_due_at).total_seconds() if row.oldest_due_at else None
        rows.append(
            {
                "row": row,
                "path": _consumer_path(row.channel_id, row.consumer_id),
                "oldest_due_age": _age(oldest),
                "oldest_due_seconds": oldest or 0,
                "rate": series.rate[-1] if series and series.rate else 0.0,
                "chart": _chart(series),
                "paused": pause_state(row.paused_until, overview.at),
                "unaccounted": overview.unaccounted.get(key, 0),
            }
        )
    template = templates.get_template("_rows.html")
    return template.render(rows=rows, can_act=can_act, at=overview.at)


@router.get("/")
async def overview(request: Request) -> Response:
    session = _viewer(request)
    snapshot = await console_of(request).live.snapshot()
    return _page(
        request,
        "overview.html",
        {"rows_html": render_rows(snapshot, session.actor.can_act), "title": "Overview"},
    )


@router.get("/events")
async def events(request: Request) -> Response:
    """The overview's table, pushed as server-sent events (`overview`) whenever it changes."""
    session = _viewer(request)
    console = console_of(request)
    live = console.live
    cookie = request.cookies.get(COOKIE)
    if live.full:
        raise _Refused(
            503,
            f"{live.max_pages} overview pages are open on this API process already; close one "
            "or reload later",
            30,
        )

    def signed_in() -> bool:
        # The session is read again: it ends at its expiry, and when its token changes.
        return time.time() < session.expires and console.sessions.read(cookie) is not None

    async def stream() -> AsyncIterator[str]:
        try:
            async with live.subscribe(session.actor.can_act) as queue:
                yield ": connected\n\n"
                while signed_in():
                    wait = min(KEEP_ALIVE, max(0.0, session.expires - time.time()))
                    try:
                        html = await asyncio.wait_for(queue.get(), wait)
                    except TimeoutError:
                        yield ": keep-alive\n\n"  # finds a closed connection, keeps proxies open
                        continue
                    data = "".join(f"data: {line}\n" for line in html.splitlines())
                    yield f"event: overview\n{data}\n"
        except LiveFull:
            # Filled between the check above and now: the page's stream ends at once.
            yield ": full\n\n"

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"X-Accel-Buffering": "no"},
    )


# -- a consumer's jobs ------------------------------------------------------------------------


@router.get("/c/{channel_id}/{consumer_id}")
async def jobs(request: Request, channel_id: str, consumer_id: str) -> Response:
    _viewer(request)
    console = console_of(request)
    params = request.query_params
    item = await console.rt.console.consumer(channel_id, consumer_id)
    try:
        which: JobFilter | None = _filter(params)
        error = None
    except InvalidInput as exc:
        which, error = None, exc.detail
    page = None
    if which is not None:
        before = _number(params["before"], "before") if params.get("before") else None
        page = await console.rt.console.search(channel_id, consumer_id, which, before)
    snapshot = await console.live.snapshot()
    row = next(
        (r for r in snapshot.overview.consumers if r.pk == item.pk),
        None,
    )
    query = which.query() if which else dict(params)
    redrives = await console.rt.redrives.list(_creds(channel_id, consumer_id))
    return _page(
        request,
        "jobs.html",
        {
            "title": f"{channel_id} / {consumer_id}",
            "consumer": item,
            "paused": pause_state(item.paused_until, datetime.now(UTC)),
            "row": row,
            "chart": _chart(snapshot.history.get((channel_id, consumer_id))) if row else "[]",
            "path": _consumer_path(channel_id, consumer_id),
            "filter": which,
            "query": query,
            "qs": urlencode(query),
            "error": error,
            "page": page,
            "next_qs": urlencode({**query, "before": page.next_before})
            if page and page.next_before
            else None,
            "statuses": ["ANY", *[s.value for s in JobStatus]],
            "redrives": redrives[:5],
            "scan_rows": SCAN_ROWS,
            "payload_budget_mib": PAYLOAD_BUDGET // (1024 * 1024),
            "done": done_text(params),
        },
        status_code=400 if error else 200,
    )


# A payload is pretty-printed only up to PRETTY_MAX bytes, and no view shows more than SHOWN_MAX
# characters: indentation grows with depth, so a few KiB of nested brackets print as megabytes.
PRETTY_MAX = 64 * 1024
SHOWN_MAX = 256 * 1024
HEX_MAX = 48 * 1024  # 16 bytes a line, 76 characters: within SHOWN_MAX


def _pretty_json(text: str) -> str | None:
    """The JSON text indented, or None: not JSON, nested deeper than the parser goes, or longer
    than SHOWN_MAX indented (the encoder is stopped there, never run to the end)."""
    try:
        value = json.loads(text)
        out: list[str] = []
        size = 0
        for chunk in json.JSONEncoder(indent=2, ensure_ascii=False).iterencode(value):
            size += len(chunk)
            if size > SHOWN_MAX:
                return None
            out.append(chunk)
    except (ValueError, RecursionError):
        return None
    return "".join(out)


def _payload_view(payload: bytes, content_type: str) -> tuple[str, str]:
    """("json" | "text" | "hex", what to show): JSON indented when that stays small, text as
    sent, anything else as a hex dump; each cut with a line saying how many bytes are left."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        if len(payload) <= PRETTY_MAX:
            pretty = _pretty_json(text)
            if pretty is not None:
                return "json", pretty
        shown = text[:SHOWN_MAX]
        if all(ch.isprintable() or ch in "\r\n\t" for ch in shown):
            rest = len(payload) - len(shown.encode("utf-8"))
            return "text", shown + (f"\n… {rest} more bytes" if rest else "")
    lines = []
    for offset in range(0, min(len(payload), HEX_MAX), 16):
        chunk = payload[offset : offset + 16]
        printed = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {chunk.hex(' '):<47}  {printed}")
    if len(payload) > HEX_MAX:
        lines.append(f"… {len(payload) - HEX_MAX} more bytes")
    return "hex", "\n".join(lines)


@router.get("/c/{channel_id}/{consumer_id}/job/{job_id}")
async def job_page(request: Request, channel_id: str, consumer_id: str, job_id: str) -> Response:
    _viewer(request)
    claimed = await console_of(request).rt.console.job(
        channel_id, consumer_id, _number(job_id, "a job id")
    )
    kind, shown = _payload_view(claimed.message.payload, claimed.message.content_type)
    return _page(
        request,
        "job.html",
        {
            "title": f"Job {claimed.job.id}",
            "job": claimed.job,
            "attempts": await console_of(request).rt.console.attempts(claimed),
            "message": claimed.message,
            "payload_kind": kind,
            "payload": shown,
            "path": _consumer_path(channel_id, consumer_id),
            "channel_id": channel_id,
            "consumer_id": consumer_id,
            "done": done_text(request.query_params),
        },
    )


# -- actions --------------------------------------------------------------------------------------


@router.get("/c/{channel_id}/{consumer_id}/confirm/{action}")
async def confirm(request: Request, channel_id: str, consumer_id: str, action: str) -> Response:
    _admin(request)
    if action not in ACTIONS:
        raise NotFound(f"no console action {action!r}")
    console = console_of(request)
    item = await console.rt.console.consumer(channel_id, consumer_id)
    params = request.query_params
    jobs: int | None = None
    more = cut = False
    which: JobFilter | None = None
    detail = ""
    if action in ("requeue-job", "delete-job"):
        job_id = _number(params.get("job"), "a job id")
        found = await console.rt.console.job(channel_id, consumer_id, job_id)
        if found.job.status is not JobStatus.DEAD:
            raise InvalidInput(f"job {job_id} is {found.job.status}; only DEAD jobs are moved here")
        jobs, detail = 1, f"job {job_id} (message {found.message.message_id})"
    elif action in ("requeue-matching", "delete-matching"):
        which = _filter(params)
        matching = await console.rt.console.matching(channel_id, consumer_id, which)
        jobs, more, cut = len(matching.ids), matching.more, matching.cut
    elif action == "redrive-matching":
        which = _filter(params)
        refusal = which.redrivable
        if refusal:
            raise InvalidInput(refusal)
        if which.status is JobStatus.DEAD:
            matching = await console.rt.console.matching(channel_id, consumer_id, which)
            jobs, more = len(matching.ids), matching.more
    elif action == "purge-dlq":
        snapshot = await console.live.snapshot()
        jobs = next((r.dead for r in snapshot.overview.consumers if r.pk == item.pk), 0)
    elif action == "unpin":
        group = item.priority.group
        if not group:
            raise InvalidInput(f"consumer {consumer_id!r} has no priority group")
        detail = f"group {group}"
    elif action in ("pause", "resume"):
        paused = item.paused_at(datetime.now(UTC))
        if paused == (action == "pause"):
            raise InvalidInput(f"consumer {consumer_id!r} is {'paused' if paused else 'running'}")
        detail = f"{channel_id}/{consumer_id}, until resumed" if action == "pause" else ""
    return _page(
        request,
        "confirm.html",
        {
            "title": ACTIONS[action],
            "action": action,
            "label": ACTIONS[action],
            "consumer": item,
            "path": _consumer_path(channel_id, consumer_id),
            "jobs": jobs,
            "more": more,
            "cut": cut,
            "payload_budget_mib": PAYLOAD_BUDGET // (1024 * 1024),
            "bulk_limit": BULK_LIMIT,
            "fields": {**(which.query() if which else {}), **{"job": params.get("job", "")}},
            "detail": detail,
            "per_second": DEFAULT_PER_SECOND,
            "max_per_second": MAX_PER_SECOND,
        },
    )


@router.post("/c/{channel_id}/{consumer_id}/do/{action}")
async def act(request: Request, channel_id: str, consumer_id: str, action: str) -> Response:
    session, form = await _posted(request)
    actor = session.actor
    if action not in ACTIONS and action != "cancel-redrive":
        raise NotFound(f"no console action {action!r}")
    rt = console_of(request).rt
    creds = _creds(channel_id, consumer_id)
    path = _consumer_path(channel_id, consumer_id)
    target = f"{channel_id}/{consumer_id}"
    done: tuple[str, int | None] = ("", None)
    go = path
    if action == "requeue-job":
        job_id = _number(form.get("job"), "a job id")
        await rt.seed_jobs.requeue_dead_job(creds, str(job_id))
        await rt.console.record(actor, action, f"{target}/job/{job_id}", 1)
        done, go = ("job-requeued", job_id), f"{path}/job/{job_id}"
    elif action == "delete-job":
        job_id = _number(form.get("job"), "a job id")
        await rt.seed_jobs.delete_dead_job(creds, str(job_id))
        await rt.console.record(actor, action, f"{target}/job/{job_id}", 1)
        done = ("job-deleted", job_id)
    elif action == "requeue-matching":
        count = await rt.console.requeue_matching(actor, channel_id, consumer_id, _filter(form))
        done = ("requeued", count)
    elif action == "delete-matching":
        count = await rt.console.delete_matching(actor, channel_id, consumer_id, _filter(form))
        done = ("deleted", count)
    elif action == "redrive-matching":
        which = _filter(form)
        refusal = which.redrivable
        if refusal or which.status is None:
            raise InvalidInput(refusal or "choose DEAD or DELIVERED")
        rate = _number(form.get("per_second"), "the rate")
        if not 1 <= rate <= MAX_PER_SECOND:
            raise InvalidInput(f"the rate is from 1 to {MAX_PER_SECOND} jobs a second")
        started = await rt.redrives.start(
            creds, RedriveRequest(which.status, which.since, which.until, rate)
        )
        await rt.console.record(
            actor, action, f"{target}/redrive/{started.id}", started.total, f"{rate}/s"
        )
        return RedirectResponse(f"{path}/redrive/{started.id}", status_code=303)
    elif action == "cancel-redrive":
        redrive_id = _number(form.get("redrive"), "a redrive id")
        cancelled = await rt.redrives.cancel(creds, redrive_id)
        await rt.console.record(
            actor, action, f"{target}/redrive/{redrive_id}", cancelled.moved, "cancelled"
        )
        return RedirectResponse(f"{path}/redrive/{redrive_id}", status_code=303)
    elif action == "purge-dlq":
        count = await rt.seed_jobs.purge_dead(creds)
        await rt.console.record(actor, action, target, count)
        done = ("purged", count)
    elif action == "unpin":
        item = await rt.console.consumer(channel_id, consumer_id)
        group = item.priority.group or ""
        unpinned = await rt.pins.unpin(item, group)
        await rt.console.record(actor, action, target, None, f"group {group}")
        done = ("unpinned" if unpinned else "not-pinned", None)
    elif action == "reset-breaker":
        changed = await rt.console.reset_breaker(actor, channel_id, consumer_id)
        done = ("breaker-reset" if changed else "breaker-closed", None)
    elif action in ("pause", "resume"):
        await rt.console.set_pause(actor, channel_id, consumer_id, action == "pause")
        done = ("paused" if action == "pause" else "resumed", None)
    code, n = done
    query = {"done": code} if n is None else {"done": code, "n": str(n)}
    return RedirectResponse(f"{go}?{urlencode(query)}", status_code=303)


@router.get("/c/{channel_id}/{consumer_id}/redrive/{redrive_id}")
async def redrive_page(
    request: Request, channel_id: str, consumer_id: str, redrive_id: str
) -> Response:
    """A redrive's progress; htmx asks for the fragment every second until it has finished
    (status 286 stops the polling)."""
    _viewer(request)
    rt = console_of(request).rt
    found = await rt.redrives.get(_creds(channel_id, consumer_id), _number(redrive_id, "an id"))
    context = {
        "title": f"Redrive {found.id}",
        "redrive": found,
        "path": _consumer_path(channel_id, consumer_id),
        "consumer_id": consumer_id,
        "channel_id": channel_id,
    }
    if request.headers.get("HX-Request"):
        status = 286 if found.status != "RUNNING" else 200
        return _page(request, "_redrive.html", context, status_code=status)
    return _page(request, "redrive.html", context)


@router.get("/audit")
async def audit(request: Request, before: str | None = None) -> Response:
    _viewer(request)
    entries = await console_of(request).rt.console.audit(
        _number(before, "before") if before else None
    )
    return _page(request, "audit.html", {"title": "Audit log", "entries": entries})
