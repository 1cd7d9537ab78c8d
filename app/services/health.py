"""Health: whether the database answers, for `/_status`."""

from __future__ import annotations

from app.store.db import Database


class HealthService:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def database(self) -> str:
        """ "ok", or "unreachable: <error type>" (never the error's text, which may hold the
        connection URL)."""
        try:
            await self._db.ping()
        except Exception as exc:  # any driver failure means "unreachable" to a health check
            return f"unreachable: {type(exc).__name__}"
        return "ok"
