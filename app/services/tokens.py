"""The key channel and producer tokens are hashed with, and the digest every request uses."""

from __future__ import annotations

import functools
import logging

from app.domain.errors import Unavailable
from app.domain.tokens import TokenDigest, is_digest
from app.store.db import Database
from app.store.secrets import TOKEN_HASH_KEY, hash_plain_tokens, stored_secret

log = logging.getLogger(__name__)

# Distinct tokens whose digests are kept, and the longest token kept (longer ones are hashed
# every time): 1,024 x (256 + 76) characters at most.
RECENT = 1024
RECENT_LENGTH = 256


class RecentDigests(TokenDigest):
    """A TokenDigest that remembers the digests of the tokens it hashed last: a publish
    hashes two tokens, an ack one, and a busy broker sees the same few tokens all day.

    Safe to keep, with no invalidation: a digest is a function of the token and the key
    alone, and the key is this object's for its whole life (TokenKeys loads it once, at start),
    so rotating a token changes what the database holds, never what a token hashes to. A
    lookup compares whole tokens (lru_cache's dict: equality after the hash), so no token
    gets another's digest. It is bounded (RECENT entries, tokens up to RECENT_LENGTH), and a
    client sending new tokens only cycles it. It holds recent tokens in memory, as their
    requests did; the process holds the key (worth more to a thief) and the admin token
    anyway, and nothing of it is logged or shown (the repr stays TokenDigest's)."""

    __slots__ = ("_recent",)

    def __init__(self, key: bytes) -> None:
        super().__init__(key)
        self._recent = functools.lru_cache(maxsize=RECENT)(super().__call__)

    def __call__(self, token: str) -> str:
        if len(token) > RECENT_LENGTH:
            return super().__call__(token)
        return self._recent(token)


class TokenKeys:
    """Loaded once at start: [http] token-hash-key, else the key migration 0011 stored."""

    def __init__(self, db: Database, configured_key: str) -> None:
        self._db = db
        self._configured = configured_key
        self._digest: TokenDigest | None = (
            RecentDigests(configured_key.encode()) if configured_key else None
        )

    async def load(self) -> None:
        """Read the key (unless configured) and hash any token stored before hashing began."""
        async with self._db.transaction() as tx:
            if self._digest is None:
                stored = await stored_secret(tx, TOKEN_HASH_KEY)
                if not stored:
                    raise RuntimeError("the database has no token hash key: run migrate")
                self._digest = RecentDigests(stored.encode())
            changed = await hash_plain_tokens(tx, self._digest, is_digest)
        if changed:
            log.info("stored %d channel and producer tokens as keyed hashes", changed)

    @property
    def digest(self) -> TokenDigest:
        if self._digest is None:
            # Only a process that never reached its database gets here (it would have loaded
            # the key at start): the same answer as any request that needs the database.
            raise Unavailable("the database is unavailable; retry")
        return self._digest
