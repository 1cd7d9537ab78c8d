"""The installation's secrets (broker_secret) and the one-time hashing of stored tokens."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select, update

from app.store.db import Tx
from app.store.schema import broker_secret, channel, producer

TOKEN_HASH_KEY = "token-hash-key"


async def stored_secret(tx: Tx, name: str) -> str | None:
    query = select(broker_secret.c.value).where(broker_secret.c.name == name)
    return (await tx.conn.execute(query)).scalar_one_or_none()


async def hash_plain_tokens(
    tx: Tx, digest: Callable[[str], str], is_digest: Callable[[str], bool]
) -> int:
    """Replace every channel and producer token still stored as written by its digest; each
    row changes only if its token is still the one read (another process may be doing the
    same). Returns the number of rows changed."""
    changed = 0
    for table in (channel, producer):
        rows = (await tx.conn.execute(select(table.c.id, table.c.token))).all()
        for id_, token in rows:
            if is_digest(token):
                continue
            result = await tx.conn.execute(
                update(table)
                .where(table.c.id == id_, table.c.token == token)
                .values(token=digest(token))
            )
            changed += result.rowcount
    return changed
