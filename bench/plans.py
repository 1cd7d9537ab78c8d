"""The plans the bench reports, of the broker's own statements: each text rendered by
app/store's functions and bound as `Queue` binds it, never a copy kept here (a copy showed the
plan of a claim the broker no longer ran).

The claim's walk of the queue and its LIMIT are planned inside the SQL function
`claimable_jobs` (migration 0010_claim_functions), and the pending count's inside
`due_jobs_ahead`: EXPLAIN of the claim shows a Function Scan for them, so their queries are
explained as well, read from the database (bench/db.py `explain_function`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from app.config import Config
from app.domain.models import PulledJob
from app.store import attempts
from app.store.jobs import PENDING_COUNT_CAP
from app.store.queue import Named, ack_sql, claim_sql, int_array
from bench import db

CLAIM_WALK = "claimable_jobs"
PENDING_WALK = "due_jobs_ahead"
_ID, _ATTEMPT = PulledJob._fields.index("id"), PulledJob._fields.index("attempt")
# The bench's broker leaves the consumers' ack wait unset: its claims lease for the default.
DEFAULT_ACK_WAIT = Config().default_ack_wait_seconds


async def pulling(conn: psycopg.AsyncConnection[Any], spec: Mapping[str, Any]) -> Named:
    """A consumer as an HTTP pull names it to the store (bench/env.py `consumer_spec`): by its
    credentials, the channel token as the API passes it on, digested."""
    return Named.by_credentials(
        spec["channel"],
        await db.stored_token(conn, spec["channel_token"]),
        spec["consumer"],
        spec["consumer_token"],
    )


def claim_statement(named: Named, batch: int, default_ack_wait: int) -> tuple[str, dict[str, Any]]:
    """An HTTP pull's claim as `Queue.claim` renders and binds it: by credentials, no byte
    budget, a consumer with no max-ack-pending (whose claim runs alone, not under its lock)."""
    sql = claim_sql(named.key, numbered=False, by_bytes=False, capped=False)
    params = named.params() | {
        "limit": batch,
        "default_ack_wait": default_ack_wait,
        "incremental_timeout": 0,
        "max_bytes": None,
    }
    return sql, params


def ack_statement(
    named: Named, pairs: Sequence[tuple[int, int | None]]
) -> tuple[str, dict[str, Any]]:
    """A batch ack as `Queue.ack` renders and binds it (two or more (job id, attempt) pairs)."""
    ids, tries = zip(*pairs, strict=True)
    sql = ack_sql(named.key, False, attempts.kept(), attempts.ACKED)
    return sql, named.params() | {"ids": int_array(ids), "attempts": int_array(tries)}


def titled(title: str, plan: list[str]) -> list[str]:
    return [f"-- {title}", *plan]


async def claim_plans(
    conn: psycopg.AsyncConnection[Any],
    named: Named,
    consumer_pk: int,
    *,
    batch: int,
    default_ack_wait: int = DEFAULT_ACK_WAIT,
) -> list[str]:
    """The claim statement's plan, then the plan of the queue walk it calls."""
    sql, params = claim_statement(named, batch, default_ack_wait)
    statement = await db.explain(conn, sql, params)
    walk = await db.explain_function(conn, CLAIM_WALK, (consumer_pk, batch))
    return [
        *titled(f"the claim (app.store.queue.claim_sql '{named.key}'), batch {batch}", statement),
        *titled(f"inside it: {CLAIM_WALK}({consumer_pk}, {batch})", walk),
    ]


async def pending_plan(
    conn: psycopg.AsyncConnection[Any], consumer_pk: int, batch: int
) -> list[str]:
    """The count of due jobs a pull reports, as the claim asks for it (the cap plus the batch,
    the claimed jobs being taken off); the scheduler's count calls the same function."""
    cap = PENDING_COUNT_CAP + batch
    plan = await db.explain_function(conn, PENDING_WALK, (consumer_pk, cap))
    return titled(f"the pending count per pull: {PENDING_WALK}({consumer_pk}, {cap})", plan)


async def ack_plan(
    conn: psycopg.AsyncConnection[Any],
    named: Named,
    *,
    batch: int,
    inflight: int,
    default_ack_wait: int = DEFAULT_ACK_WAIT,
) -> list[str]:
    """A batch ack of the last `batch` jobs of `inflight` claimed by the broker's own claim,
    as slow workers or long leases leave them, all in a transaction that is rolled back."""
    async with conn.transaction(force_rollback=True):
        sql, params = claim_statement(named, inflight, default_ack_wait)
        rows = await (await conn.execute(sql, params)).fetchall()
        pairs = [(int(row[_ID]), int(row[_ATTEMPT])) for row in rows[-batch:]]
        if len(pairs) < 2:
            return [f"-- no batch ack: {len(rows)} job(s) could be claimed"]
        sql, params = ack_statement(named, pairs)
        plan = await db.explain(conn, sql, params)
    what = f"app.store.queue.ack_sql '{named.key}'"
    return titled(f"batch ack of {len(pairs)} ({what}), {len(rows)} claimed before it", plan)
