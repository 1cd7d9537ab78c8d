"""Gateway HMAC ([gateway-auth] mode=hmac): every request outside the exempt paths carries
`X-Broker-Signature: t=<unix seconds>,v1=<hex>` and/or `,v2=<hex>`; token checks still apply
after it.

v1, as the Go original defines it: hex(HMAC-SHA256(secret, "<t>.<body>")), with its status
codes and texts. It covers the body only, so a signed body can be replayed against another path
within the tolerance.

v2 covers the request as well, in a text no two requests share:

    hex(HMAC-SHA256(secret, "v2\\n<t>\\n<METHOD>\\n<target>\\n<hex SHA-256 of the body>"))

each field ending at a line feed (none after the last): <t> the decimal timestamp of the
header, <METHOD> upper case, <target> the path and query exactly as sent (`/a%20b?x=1`, no
decoding; "?<query>" only when there is a query), and the lowercase hex SHA-256 of the body
(of b"" when there is none). No field can hold a line feed (digits, an HTTP token, a
request-target, which has no whitespace, and a fixed-length hash; a target that does anyway is
refused), so every text is read one way only. `require-v2` refuses v1.

Statuses: no header 401; a header that is not ASCII, or a v1/v2 that is not 64 hex digits, 403
"invalid signature" (it cannot match); a header of any other shape 401 "malformed"; a timestamp
outside the tolerance 403; then the body is read, at most its route's cap (413 beyond it, 408
past [http] read-timeout); then the signature is checked (403). With `reject-replays` a v2
signature already accepted inside its tolerance window is refused (403): the cache is this
process's own, keeps each signature until its timestamp leaves the window, and holds at most
REPLAY_CAPACITY of them; when full of live entries it answers 503 rather than forget one.

Pure ASGI, so the body it reads is handed on unchanged to the routes.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import string
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.limits import body_limit, read_body
from app.config import Config, GatewayAuthConfig
from app.domain.errors import PayloadTooLarge

HEADER = b"x-broker-signature"
# The Go original's texts (controllers/hmac_middleware.go), as plain text bodies.
MISSING = "missing X-Broker-Signature header"
MALFORMED = "malformed X-Broker-Signature header"
STALE = "request timestamp outside tolerance window"
INVALID = "invalid signature"
V2_REQUIRED = "invalid signature: a v2 signature is required"
REPLAYED = "invalid signature: this v2 signature was already used"
CACHE_FULL = "too many signed requests to remember; retry"

# Signatures the replay cache holds at most (about 200 bytes each).
REPLAY_CAPACITY = 100_000
_HEX = frozenset(string.hexdigits)


@dataclass(frozen=True, slots=True)
class Signature:
    timestamp: int
    v1: str | None
    v2: str | None


def parse_signature(header: str) -> Signature:
    """The fields of "t=<unix>,v1=<hex>" and/or ",v2=<hex>"; ValueError(MALFORMED) for another
    shape. The header must be ASCII already."""
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
    return Signature(int(raw), fields.get("v1"), fields.get("v2"))


def sign_v1(secret: bytes, timestamp: int, body: bytes) -> str:
    return hmac.new(secret, b"%d." % timestamp + body, hashlib.sha256).hexdigest()


def signed_text_v2(timestamp: int, method: str, target: bytes, body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest().encode()
    return b"v2\n%d\n%s\n%s\n%s" % (timestamp, method.upper().encode(), target, digest)


def sign_v2(secret: bytes, timestamp: int, method: str, target: bytes, body: bytes) -> str:
    message = signed_text_v2(timestamp, method, target, body)
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _hex_digest(value: str | None) -> bool:
    return value is None or (len(value) == 64 and all(ch in _HEX for ch in value))


def header_refusal(
    config: GatewayAuthConfig, header: bytes | None, now: float
) -> tuple[int, str] | Signature:
    """What the header alone says: a refusal (status, text), or the signature to check once
    the body is read."""
    if not header:
        return 401, MISSING
    if not header.isascii():
        return 403, INVALID
    try:
        signature = parse_signature(header.decode("ascii"))
    except ValueError:
        return 401, MALFORMED
    if not (_hex_digest(signature.v1) and _hex_digest(signature.v2)):
        return 403, INVALID
    if abs(now - signature.timestamp) > config.hmac_timestamp_tolerance_seconds:
        return 403, STALE
    # The replay cache keeps v2 signatures: with it on, a v1 one (which a replay could be
    # cut down to) is refused like under require-v2.
    if signature.v2 is None and (config.require_v2 or config.reject_replays):
        return 403, V2_REQUIRED
    return signature


def body_refusal(
    config: GatewayAuthConfig, signature: Signature, method: str, target: bytes, body: bytes
) -> tuple[int, str] | None:
    """Whether the signature covers this request (None) or why not."""
    secret = config.hmac_shared_secret
    if signature.v2 is not None:
        if any(byte <= 0x20 or byte == 0x7F for byte in target):
            return 403, INVALID  # a target with whitespace would make the text ambiguous
        expected = sign_v2(secret, signature.timestamp, method, target, body)
        return None if hmac.compare_digest(expected, signature.v2.lower()) else (403, INVALID)
    assert signature.v1 is not None
    expected = sign_v1(secret, signature.timestamp, body)
    return None if hmac.compare_digest(expected, signature.v1.lower()) else (403, INVALID)


class ReplayCache:
    """v2 signatures accepted, each until its timestamp leaves the tolerance window (it is
    refused as stale from then on), at most `capacity` of them."""

    def __init__(self, capacity: int = REPLAY_CAPACITY) -> None:
        self._capacity = capacity
        self._until: dict[str, float] = {}
        self._expiring: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._until)

    def admit(self, signature: str, until: float, now: float) -> bool | None:
        """True: first seen, now remembered; False: seen before; None: full."""
        expiring = self._expiring
        while expiring and expiring[0][0] < now:
            _, old = heapq.heappop(expiring)
            self._until.pop(old, None)
        if signature in self._until:
            return False
        if len(self._until) >= self._capacity:
            return None
        self._until[signature] = until
        heapq.heappush(expiring, (until, signature))
        return True


class GatewayHmac:
    def __init__(
        self, app: ASGIApp, config: Config, clock: Callable[[], float] = time.time
    ) -> None:
        self._app = app
        self._config = config
        self._gateway = config.gateway_auth
        self._clock = clock
        self._replays = ReplayCache() if config.gateway_auth.reject_replays else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self._gateway.auth_exempt_paths):
            await self._app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == HEADER), None)
        checked = header_refusal(self._gateway, header, self._clock())
        if not isinstance(checked, Signature):
            await _answer(send, *checked)
            return
        try:
            body = await read_body(
                receive,
                Headers(scope=scope),
                limit=body_limit(self._config, scope["path"]),
                within=self._config.http.read_timeout,
            )
        except PayloadTooLarge as exc:
            await _answer(send, 413, exc.detail)
            return
        except HTTPException as exc:  # 408
            await _answer(send, exc.status_code, exc.detail)
            return
        except ClientDisconnect:
            return
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        refused = body_refusal(self._gateway, checked, scope["method"], target, body)
        if refused is None and checked.v2 is not None and self._replays is not None:
            until = checked.timestamp + self._gateway.hmac_timestamp_tolerance_seconds
            admitted = self._replays.admit(checked.v2.lower(), until, self._clock())
            if admitted is None:
                await _answer(send, 503, CACHE_FULL, [(b"retry-after", b"1")])
                return
            if not admitted:
                refused = 403, REPLAYED
        if refused is not None:
            await _answer(send, *refused)
            return
        await self._app(scope, _replaying(body, receive), send)


async def _answer(
    send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = text.encode()
    fixed = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", b"%d" % len(body)),
    ]
    await send(
        {"type": "http.response.start", "status": status, "headers": [*fixed, *(headers or [])]}
    )
    await send({"type": "http.response.body", "body": body})


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body read once more, and then goes on."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
