"""Health: whether the database answers and its schema is current, for `/_status` and
`/_ready`."""

from __future__ import annotations

from app.store.db import Database


class HealthService:
    def __init__(self, db: Database, heads: frozenset[str] = frozenset()) -> None:
        self._db = db
        self._heads = heads

    async def database(self) -> str:
        """ "ok", or "unreachable: <error type>" (never the error's text, which may hold the
        connection URL)."""
        try:
            await self._db.ping()
        except Exception as exc:  # any driver failure means "unreachable" to a health check
            return f"unreachable: {type(exc).__name__}"
        return "ok"

    async def schema(self) -> str:
        """ "current"; "not current: ..." (the database's revisions and this code's: run
        `webhook-broker migrate`, or deploy the newer code); or "unknown: <error type>"."""
        try:
            at = await self._db.schema_revisions()
        except Exception as exc:  # no table yet, or no database: not current either way
            return f"unknown: {type(exc).__name__}"
        if at == self._heads:
            return "current"
        return f"not current: database at {sorted(at)}, this code at {sorted(self._heads)}"
