"""Keyset pagination over one unique, ordered column; cursors are opaque to clients."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Select

from app.domain.errors import InvalidInput
from app.domain.models import Cursor


def encode_cursor(value: object) -> str:
    return base64.urlsafe_b64encode(str(value).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    padded = cursor + "=" * (-len(cursor) % 4)
    try:
        return base64.urlsafe_b64decode(padded.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidInput("malformed pagination cursor") from None


def decode_int_cursor(cursor: str) -> int:
    try:
        return int(decode_cursor(cursor))
    except ValueError:
        raise InvalidInput("malformed pagination cursor") from None


def paginate(
    query: Select[Any], key: ColumnElement[Any], cursor: Cursor, limit: int, as_int: bool = False
) -> Select[Any]:
    """Apply the cursor and fetch one extra row to know whether another page exists."""
    decode = decode_int_cursor if as_int else decode_cursor
    if cursor.previous is not None:
        return query.where(key < decode(cursor.previous)).order_by(key.desc()).limit(limit + 1)
    if cursor.next is not None:
        query = query.where(key > decode(cursor.next))
    return query.order_by(key).limit(limit + 1)


def page_bounds(
    rows: Sequence[Any], cursor: Cursor, limit: int, key: str
) -> tuple[list[Any], str | None, str | None]:
    """Cut the extra row, restore ascending order, and compute next/previous cursors."""
    more = len(rows) > limit
    items = list(rows[:limit])
    if cursor.previous is not None:
        items.reverse()
        has_next, has_previous = True, more
    else:
        has_next, has_previous = more, cursor.next is not None
    next_cursor = encode_cursor(getattr(items[-1], key)) if items and has_next else None
    previous_cursor = encode_cursor(getattr(items[0], key)) if items and has_previous else None
    return items, next_cursor, previous_cursor
