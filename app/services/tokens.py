"""The key channel and producer tokens are hashed with, and the digest every request uses."""

from __future__ import annotations

import logging

from app.domain.errors import Unavailable
from app.domain.tokens import TokenDigest, is_digest
from app.store.db import Database
from app.store.secrets import TOKEN_HASH_KEY, hash_plain_tokens, stored_secret

log = logging.getLogger(__name__)


class TokenKeys:
    """Loaded once at start: [http] token-hash-key, else the key migration 0011 stored."""

    def __init__(self, db: Database, configured_key: str) -> None:
        self._db = db
        self._configured = configured_key
        self._digest: TokenDigest | None = (
            TokenDigest(configured_key.encode()) if configured_key else None
        )

    async def load(self) -> None:
        """Read the key (unless configured) and hash any token stored before hashing began."""
        async with self._db.transaction() as tx:
            if self._digest is None:
                stored = await stored_secret(tx, TOKEN_HASH_KEY)
                if not stored:
                    raise RuntimeError("the database has no token hash key: run migrate")
                self._digest = TokenDigest(stored.encode())
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
