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


class Signer:
    """The signatures of one consumer's deliveries at one moment: keys, timestamp and the
    signed texts' prefixes prepared once for a claim's jobs, not once per delivery."""

    def __init__(self, token: str, in_force: tuple[str, ...], timestamp: int) -> None:
        self.timestamp = timestamp
        self._token = token.encode()
        self._keys = tuple(_key(secret) for secret in in_force)
        self._broker_prefix = f"{timestamp}.".encode()
        self._standard_infix = f".{timestamp}.".encode()

    def broker(self, body: bytes) -> str:
        """`t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" keyed by the consumer
        token>` (hmac.digest: OpenSSL's one-shot HMAC, no Python HMAC object)."""
        digest = hmac.digest(self._token, self._broker_prefix + body, "sha256")
        return f"t={self.timestamp},v1={digest.hex()}"

    def standard(self, webhook_id: str, body: bytes) -> str:
        """`v1,<base64 HMAC-SHA256 of "id.timestamp.body">` per secret in force, space-separated
        (two during a rotation's overlap; empty without a secret)."""
        signed = webhook_id.encode() + self._standard_infix + body
        return " ".join(
            "v1," + base64.b64encode(hmac.digest(key, signed, "sha256")).decode()
            for key in self._keys
        )


def secrets_in_force(
    current: str | None, previous: str | None, previous_until: datetime | None, now: datetime
) -> tuple[str, ...]:
    if current is None:
        return ()
    if previous is not None and previous_until is not None and now < previous_until:
        return (current, previous)
    return (current,)
