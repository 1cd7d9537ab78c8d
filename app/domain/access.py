"""Who may do what over HTTP, from the Authorization header and the configured tokens.

Three credentials besides the resources' own tokens: the admin token (every change and every
read), the reader token (every GET, nothing else), and none. A broker with neither token set
is open, which the configuration allows only on a loopback listener or with
[http] allow-anonymous-admin=true (app/config/load.py).
"""

from __future__ import annotations

import enum
import hmac

from app.domain.errors import Forbidden, Unauthenticated


class Role(enum.Enum):
    ADMIN = "admin"
    READER = "reader"
    NONE = "none"  # no bearer token given


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None when there is none.
    Any other scheme (Basic, a bare token) is no bearer token either."""
    if not authorization or authorization[:7].lower() != "bearer ":
        return None
    return authorization[7:].strip()


def _same(given: str, expected: str) -> bool:
    # Secrets from the configuration, compared in constant time.
    return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())


def role_of(authorization: str | None, admin_token: str, reader_token: str) -> Role:
    """The role a bearer token proves; a bearer token that is neither is a 403."""
    given = bearer(authorization)
    if given is None:
        return Role.NONE
    if _same(given, admin_token):
        return Role.ADMIN
    if _same(given, reader_token):
        return Role.READER
    raise Forbidden("the bearer token matches neither the admin nor the reader token")


def check_change(authorization: str | None, admin_token: str, reader_token: str) -> None:
    """A change to channels, producers or consumers: the admin token, when one is set. The
    reader token never changes anything, admin token or not."""
    given = bearer(authorization)
    if given is not None and _same(given, reader_token):
        raise Forbidden("the reader token allows reads only")
    if not admin_token:
        return
    if given is None:
        raise Unauthenticated("this change needs Authorization: Bearer <admin-token>")
    role_of(authorization, admin_token, reader_token)  # 403 for a token that is neither


def read_role(
    authorization: str | None, admin_token: str, reader_token: str, *, guarded: bool
) -> Role | None:
    """The role that allows a read; None when the read still needs a resource's own token
    (a channel's, for that channel's reads). Open reads (not guarded) need nothing."""
    if not guarded:
        return Role.NONE
    role = role_of(authorization, admin_token, reader_token)
    return None if role is Role.NONE else role


def stands_in(
    authorization: str | None, admin_token: str, reader_token: str, *, read: bool
) -> bool:
    """Whether a bearer token stands in for a consumer's own tokens (DLQ, redrive and job
    routes): the admin token always, the reader token for reads. Any other bearer token is
    left to the consumer's tokens to settle (a proxy may add one of its own)."""
    given = bearer(authorization)
    if given is None:
        return False
    return _same(given, admin_token) or (read and _same(given, reader_token))


READ_CREDENTIALS = "Authorization: Bearer <reader-token> or <admin-token>"


def read_refused(channel_scoped: bool) -> Unauthenticated:
    also = " or the channel's X-Broker-Channel-Token" if channel_scoped else ""
    return Unauthenticated(f"this read needs {READ_CREDENTIALS}{also}")
