"""Column types that behave the same on PostgreSQL and SQLite."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Dialect, Float
from sqlalchemy.types import TypeDecorator, TypeEngine


class Timestamp(TypeDecorator[datetime]):
    """timestamptz on PostgreSQL; epoch seconds (REAL) on SQLite.

    SQLite has no timestamp type; storing epoch seconds lets the hot statements do lease
    arithmetic (`now + seconds`) and comparisons in SQL on both databases.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(Float())
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        if dialect.name == "sqlite":
            return value.timestamp()
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, int | float):
            return datetime.fromtimestamp(value, tz=UTC)
        if isinstance(value, datetime) and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        assert isinstance(value, datetime)
        return value
