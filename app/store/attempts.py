"""Each job's attempt history: the last `[ui] attempts-kept` attempts, oldest first, in the
job row's `attempts` column (migration 0015), for the console's job page.

An attempt is recorded where it ends, by the statement that already moves the job (ack, nak,
term, lease expiry, a push's outcome): one more SET of that UPDATE, not a statement of its
own, so a delivery costs no extra round trip and no extra index entry. Each entry is the
attempt's start (`at`, the claim, epoch seconds), its length (`ms`, claim to outcome), the
outcome and what is known of it: a push's HTTP status (`code`) and error with the first bytes
of the callback's answer, a term's reason. The array is trimmed to the newest `kept` entries
in the same expression; it goes when its job goes.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    select,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import JSONB

from app.store.db import now
from app.store.schema import job

# How much of an error an entry keeps (the dispatcher keeps 200 bytes of an answer already).
ERROR_CHARS = 300

DEFAULT_KEPT = 10  # [ui] attempts-kept's default
_kept = DEFAULT_KEPT


def keep(count: int) -> None:
    """Set from [ui] attempts-kept when a process starts (before any statement is built)."""
    global _kept
    _kept = max(1, int(count))


def kept() -> int:
    return _kept


def note(outcome: str, *, code: int | None = None, error: str | None = None) -> str:
    """The outcome part of an entry, as the JSON object its statement binds."""
    fields: dict[str, Any] = {"outcome": outcome}
    if code is not None:
        fields["code"] = code
    if error:
        fields["error"] = error[:ERROR_CHARS]
    return json.dumps(fields, separators=(",", ":"))


ACKED = note("ack")


def append_sql(outcome: str, kept: int) -> str:
    """PostgreSQL's SET value, as text (app/store/queue.py's ack): the entry appended, the
    array sliced to its last `kept` entries. `outcome` is a `note` made here from the broker's
    own words and numbers (an ack, a push's status), written into the text: each of the few
    there are is a prepared statement of its own, with no parameter more to bind."""
    literal = outcome.replace("'", "''")
    entry = f"""(jsonb_build_object(
                'at', round(extract(epoch FROM job.claimed_at), 3),
                'ms', round(extract(epoch FROM now() - job.claimed_at) * 1000))
                || '{literal}'::jsonb)"""
    # Sliced only when the history is full (a job retried `kept` times): the jsonpath slice
    # on every row cost a batch ack of 100 a twentieth of its time (1.26 against 1.18 ms,
    # bench/journal, 2026-11-27).
    return f"""CASE WHEN coalesce(jsonb_array_length(job.attempts), 0) < {kept}
            THEN coalesce(job.attempts, '[]'::jsonb) || {entry}
            ELSE jsonb_path_query_array(job.attempts || {entry},
                '$[last - {kept - 1} to last]') END"""


def appended(dialect: str, outcome: str) -> ColumnElement[Any]:
    """The same for the statements written in SQLAlchemy Core, on either database; `outcome`
    is a `note`."""
    given = bindparam("attempt_note", outcome, type_=Text)
    if dialect == "postgresql":
        entry: ColumnElement[Any] = func.jsonb_build_object(
            "at",
            func.round(func.extract("epoch", job.c.claimed_at), 3),
            "ms",
            func.round(func.extract("epoch", func.now() - job.c.claimed_at) * 1000),
        ).op("||")(cast(given, JSONB))
        listed = func.coalesce(job.c.attempts, literal_column("'[]'::jsonb")).op("||")(entry)
        full = func.coalesce(func.jsonb_array_length(job.c.attempts), 0) >= kept()
        sliced = func.jsonb_path_query_array(
            listed, literal_column(f"'$[last - {kept() - 1} to last]'")
        )
        return case((full, sliced), else_=listed)
    # SQLite: JSON text; the slice is a walk of the array's entries (json_each keeps order).
    start = func.json_object(
        "at",
        func.round(job.c.claimed_at, 3),
        "ms",
        func.round((now(dialect) - job.c.claimed_at) * 1000),
    )
    history = func.coalesce(cast(job.c.attempts, Text), literal_column("'[]'"))
    whole = func.json_insert(history, "$[#]", func.json_patch(start, given))
    each = func.json_each(whole).table_valued("key", "value")
    newest = (
        select(func.json_group_array(func.json(each.c.value)))
        .where(each.c.key >= func.json_array_length(whole) - kept())
        .scalar_subquery()
    )
    return type_coerce(newest, JSON)
