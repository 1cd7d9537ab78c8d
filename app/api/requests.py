"""Request ids, as the Go original keeps them: `X-Request-ID` is read (or made) for every
request, echoed on its response, and written on its access log line, so that a client's report
and the broker's log meet. One line per request: id, method, path (never the query, the body or
a header), status and duration."""

from __future__ import annotations

import logging
import random
import re
import time
from typing import Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class RequestMetrics(Protocol):
    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None: ...


HEADER = b"x-request-id"
# What a client may choose as its id: it is written to the log as it is.
_GIVEN = re.compile(rb"^[A-Za-z0-9._:/+=-]{1,128}$")

log = logging.getLogger("webhook_broker.access")


def request_id(given: bytes | None) -> str:
    if given is not None and _GIVEN.match(given):
        return given.decode("ascii")
    # 128 random bits as 32 hex digits, the form uuid4().hex had, without its read of
    # os.urandom and its UUID object per request (a sixtieth of a publish's CPU). An id
    # names a request, it guards nothing; the generator is seeded from the system at start
    # and again in a forked child, so processes do not repeat each other's ids.
    return f"{random.getrandbits(128):032x}"


def _metrics(scope: Scope) -> RequestMetrics | None:
    """The runtime's metrics (the runtime may be made after the middleware, by the lifespan)."""
    runtime = getattr(getattr(scope.get("app"), "state", None), "runtime", None)
    return getattr(runtime, "metrics", None)


def _ids(scope: Scope) -> dict[str, str]:
    """The channel and consumer a request was about (path parameters), for the log line."""
    params = scope.get("path_params") or {}
    return {
        f"{name}_id": str(params[f"{name}_id"])
        for name in ("channel", "consumer")
        if f"{name}_id" in params
    }


class RequestIds:
    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == HEADER), None)
        rid = request_id(given)
        scope.setdefault("state", {})["request_id"] = rid
        started = time.perf_counter()
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, rid.encode())]}
            await send(message)

        try:
            await self._app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - started
            # Checked first: below INFO (the bench's, a busy deployment's) the line's fields
            # would be built for nothing on every request.
            if log.isEnabledFor(logging.INFO):
                _access_line(scope, rid, status, seconds)
            metrics = _metrics(scope)
            if metrics is not None:
                # The route's template, never the path itself: ids would make a series each.
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                metrics.observe_request(scope["method"], route, status, seconds)


def _access_line(scope: Scope, rid: str, status: int, seconds: float) -> None:
    log.info(
        "%s %s %s %d %.1fms",
        rid,
        scope["method"],
        scope["path"],
        status,
        seconds * 1000,
        extra={
            "request_id": rid,
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "duration_ms": round(seconds * 1000, 1),
            **_ids(scope),
        },
    )
