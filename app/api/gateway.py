"""Gateway HMAC ([gateway-auth] mode=hmac): every request outside the exempt paths carries
`X-Broker-Signature: t=<unix seconds>,v1=<hex>`, the HMAC-SHA256 of "<t>.<body>" under the
shared secret, as the Go original checks it, with its status codes and texts. Its v1 lets a
signed body be replayed against another path within the tolerance, so we take a `v2` as well:
the HMAC of "<t>.<METHOD>.<path>[?<query>].<body>" (the path and query as sent, undecoded);
`require-v2` refuses v1. Token checks still apply after it.

Pure ASGI, so the body it reads is handed on unchanged to the routes.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.config import GatewayAuthConfig

HEADER = b"x-broker-signature"
# The Go original's texts (controllers/hmac_middleware.go), as plain text bodies.
MISSING = "missing X-Broker-Signature header"
MALFORMED = "malformed X-Broker-Signature header"
STALE = "request timestamp outside tolerance window"
INVALID = "invalid signature"
V2_REQUIRED = "invalid signature: a v2 signature is required"


def parse_signature(header: str) -> tuple[int, str | None, str | None]:
    """(timestamp, v1, v2) of "t=<unix>,v1=<hex>" and/or ",v2=<hex>"; ValueError if malformed."""
    fields: dict[str, str] = {}
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name not in ("t", "v1", "v2") or name in fields or not value:
            raise ValueError(MALFORMED)
        fields[name] = value
    if "t" not in fields or not ("v1" in fields or "v2" in fields):
        raise ValueError(MALFORMED)
    raw = fields["t"]
    if not raw.lstrip("-").isdigit() or len(raw) > 19:
        raise ValueError(MALFORMED)
    return int(raw), fields.get("v1"), fields.get("v2")


def sign_v1(secret: bytes, timestamp: int, body: bytes) -> str:
    return hmac.new(secret, b"%d." % timestamp + body, hashlib.sha256).hexdigest()


def sign_v2(secret: bytes, timestamp: int, method: str, target: bytes, body: bytes) -> str:
    message = b"%d.%s.%s." % (timestamp, method.upper().encode(), target) + body
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def refusal(
    config: GatewayAuthConfig, header: str | None, method: str, target: bytes, body: bytes,
    now: float,
) -> tuple[int, str] | None:  # fmt: skip
    """Why the request is refused (status, text), or None when its signature holds."""
    if not header:
        return 401, MISSING
    try:
        timestamp, v1, v2 = parse_signature(header)
    except ValueError:
        return 401, MALFORMED
    if abs(now - timestamp) > config.hmac_timestamp_tolerance_seconds:
        return 403, STALE
    secret = config.hmac_shared_secret
    if v2 is not None:
        expected = sign_v2(secret, timestamp, method, target, body)
        return None if hmac.compare_digest(expected, v2) else (403, INVALID)
    if config.require_v2:
        return 403, V2_REQUIRED
    assert v1 is not None
    return None if hmac.compare_digest(sign_v1(secret, timestamp, body), v1) else (403, INVALID)


class GatewayHmac:
    def __init__(
        self, app: ASGIApp, config: GatewayAuthConfig, clock: Callable[[], float] = time.time
    ) -> None:
        self._app = app
        self._config = config
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self._config.auth_exempt_paths):
            await self._app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == HEADER), None)
        body, replay = await _read_body(receive)
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        refused = refusal(
            self._config,
            header.decode("latin-1") if header is not None else None,
            scope["method"],
            target,
            body,
            self._clock(),
        )
        if refused is not None:
            status, text = refused
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")],
                }
            )
            await send({"type": "http.response.body", "body": text.encode()})
            return
        await self._app(scope, replay, send)


async def _read_body(receive: Receive) -> tuple[bytes, Receive]:
    """The whole request body, and a `receive` that gives it again and then goes on."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away while sending
            first: Message = message
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            break
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return first
        return await receive()

    return b"".join(chunks), replay
