"""Channel and producer tokens at rest: a keyed hash (HMAC-SHA256) of each, never the token.

A request's token is hashed with the same key and compared by the database, so a stolen copy
of the database (a backup, a replica, a dump in a ticket) gives no token that a request could
use, and the comparisons stay one string equality in the statements that already make them.
Consumer tokens are kept as they are: push deliveries send them to the consumer's endpoint.
"""

from __future__ import annotations

import hashlib
import hmac

DIGEST_PREFIX = "hmac-sha256:"


class TokenDigest:
    """The stored form of a token, under one key (the same key for every process)."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if not key:
            raise ValueError("the token hash key must not be empty")
        self._key = key

    def __call__(self, token: str) -> str:
        mac = hmac.new(self._key, token.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return DIGEST_PREFIX + mac.hexdigest()

    def optional(self, token: str | None) -> str | None:
        """None stays None: no token given never matches."""
        return None if token is None else self(token)

    def __repr__(self) -> str:
        return "TokenDigest(<key redacted>)"


def is_digest(stored: str) -> bool:
    """Whether a stored token is already a digest (rows written before tokens were hashed are
    hashed once, at start)."""
    return stored.startswith(DIGEST_PREFIX) and len(stored) == len(DIGEST_PREFIX) + 64
