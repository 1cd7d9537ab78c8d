"""Console sessions: a signed cookie naming the role and a random session id, and the CSRF token
of that session.

The cookie holds no token: `role.session.expires.signature`, signed (HMAC-SHA256) with a key
derived from the role's own token, so that changing [http] admin-token or reader-token ends
every session signed in with the old one. A broker with neither token (a loopback listener)
signs with a key made at start: its sessions end with the process. The CSRF token of a session
is the same key's HMAC of the session id: every form carries it, and a POST without it is
refused (SameSite=Strict alone leaves older browsers and same-site pages open).

Signing out deletes the cookie in that browser; there is no server-side list of ended sessions
(the cookie is checked by its signature alone, in every API process, with no database read). A
copied cookie therefore lives until it expires: to end every session at once, change the
token (docs/console.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from app.config import Config
from app.domain.console import Actor

COOKIE = "wb_console"
PRE_COOKIE = "wb_console_signin"  # the sign-in form's own CSRF token (double submit)
LIFETIME_SECONDS = 12 * 3600
_CONTEXT = b"webhook-broker console session v1"
# Failed sign-ins an address may make in FAILURE_WINDOW seconds before it waits.
MAX_FAILURES = 10
FAILURE_WINDOW = 60.0
TRACKED_ADDRESSES = 4096


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass(frozen=True, slots=True)
class Session:
    actor: Actor
    csrf: str
    expires: int  # unix seconds


class Sessions:
    def __init__(self, config: Config) -> None:
        http = config.http
        self._tokens = {"admin": http.admin_token, "reader": http.reader_token}
        self.open = not (http.admin_token or http.reader_token)
        self._process_key = secrets.token_bytes(32)

    def _key(self, role: str) -> bytes:
        token = self._tokens.get(role, "")
        if self.open:
            return self._process_key
        if not token:
            return b""
        return hmac.new(token.encode(), _CONTEXT, hashlib.sha256).digest()

    def _sign(self, key: bytes, text: str) -> str:
        return _b64(hmac.new(key, text.encode(), hashlib.sha256).digest())

    def role_of_token(self, given: str) -> str | None:
        """The role a token signs in as (constant-time comparisons); None: neither."""
        found = None
        for role, token in self._tokens.items():
            if token and hmac.compare_digest(given.encode(), token.encode()):
                found = role
        return found

    def issue(self, role: str) -> str:
        """A new session's cookie value."""
        session = secrets.token_hex(8)
        body = f"{role}.{session}.{int(time.time()) + LIFETIME_SECONDS}"
        return f"{body}.{self._sign(self._key(role), body)}"

    def read(self, cookie: str | None) -> Session | None:
        if not cookie:
            return None
        parts = cookie.split(".")
        if len(parts) != 4:
            return None
        role, session, expires, signature = parts
        key = self._key(role) if role in self._tokens else b""
        if not key:
            return None
        expected = self._sign(key, f"{role}.{session}.{expires}")
        if not hmac.compare_digest(signature.encode(), expected.encode()):
            return None
        if not expires.isdigit() or int(expires) < time.time():
            return None
        return Session(Actor(role, session), self._sign(key, f"csrf.{session}"), int(expires))

    @staticmethod
    def new_signin_token() -> str:
        return secrets.token_urlsafe(24)


class FailedSignIns:
    """Failed sign-ins by client address, in this process: after MAX_FAILURES in FAILURE_WINDOW
    seconds the address waits until the oldest of them is that old. The tokens are long random
    strings, so this is not what keeps them from being guessed; it keeps a guesser from making
    the API process check thousands a second. Behind a proxy every client shares its address."""

    def __init__(self) -> None:
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, address: str, at: float | None = None) -> float:
        """Seconds the address must wait before its next try (0: none)."""
        moment = time.monotonic() if at is None else at
        failures = self._failures.get(address)
        if failures is None:
            return 0.0
        while failures and failures[0] <= moment - FAILURE_WINDOW:
            failures.popleft()
        if not failures:
            del self._failures[address]
            return 0.0
        if len(failures) < MAX_FAILURES:
            return 0.0
        return failures[0] + FAILURE_WINDOW - moment

    def failed(self, address: str, at: float | None = None) -> None:
        moment = time.monotonic() if at is None else at
        failures = self._failures.pop(address, None) or deque(maxlen=MAX_FAILURES)
        failures.append(moment)
        self._failures[address] = failures  # the most recent last: the oldest go first
        while len(self._failures) > TRACKED_ADDRESSES:
            self._failures.popitem(last=False)
