"""Signatures a push delivery carries: the broker's own `X-Broker-Signature` (kept for existing
receivers) and Standard Webhooks' `webhook-signature` (standardwebhooks.com), whose secrets
are `whsec_` + base64 of the key bytes."""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import secrets
from datetime import datetime

from app.domain.errors import InvalidInput

SECRET_PREFIX = "whsec_"
KEY_BYTES = 32
MIN_KEY_BYTES, MAX_KEY_BYTES = 24, 64  # the range the specification accepts


def broker_signature(token: str, timestamp: int, body: bytes) -> str:
    """`t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" keyed by the consumer token>`."""
    # hmac.digest: OpenSSL's one-shot HMAC, no Python HMAC object per delivery.
    digest = hmac.digest(token.encode(), f"{timestamp}.".encode() + body, "sha256")
    return f"t={timestamp},v1={digest.hex()}"


def new_signing_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()


def parse_signing_secret(raw: str) -> str:
    """A secret given on a PUT: `whsec_` and base64 of 24 to 64 bytes."""
    if not raw.startswith(SECRET_PREFIX):
        raise InvalidInput("signingSecret must start with whsec_")
    try:
        key = base64.b64decode(raw[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("signingSecret must be whsec_ followed by base64") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise InvalidInput(f"signingSecret must hold {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes")
    return raw


@functools.lru_cache(maxsize=1024)
def _key(secret: str) -> bytes:
    """The key bytes, decoded once per secret (not once per delivery)."""
    return base64.b64decode(secret[len(SECRET_PREFIX) :])


def standard_signature(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "id.timestamp.body">`."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.digest(_key(secret), signed, "sha256")
    return "v1," + base64.b64encode(digest).decode()


def standard_signatures(
    secrets_in_force: tuple[str, ...], webhook_id: str, timestamp: int, body: bytes
) -> str:
    """Space-separated, one per secret in force (two during a rotation's overlap)."""
    return " ".join(standard_signature(s, webhook_id, timestamp, body) for s in secrets_in_force)


def secrets_in_force(
    current: str | None, previous: str | None, previous_until: datetime | None, now: datetime
) -> tuple[str, ...]:
    if current is None:
        return ()
    if previous is not None and previous_until is not None and now < previous_until:
        return (current, previous)
    return (current,)
