"""Times that clients send (RFC 3339 with an offset), read once for every route."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_moment(raw: object) -> datetime | None:
    """The time in UTC; None when `raw` is not an ISO 8601 / RFC 3339 time with an offset, or
    lies outside what a UTC time can hold (0001-01-01T00:00:00+01:00, 9999-12-31T23:59-01:00)."""
    if not isinstance(raw, str):
        return None
    try:
        moment = datetime.fromisoformat(raw.strip())
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        return None
