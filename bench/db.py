"""SQL the orchestrator runs directly: backlogs, window counts, statistics, plans.

Jobs are counted here, from the database, by the timestamps the broker's own statements write
(`claimed_at`, `status_changed_at`, `created_at`), inside a window read from the database clock.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql as pgsql

from app.domain.tokens import TokenDigest

PAYLOAD_BYTES = 100


def payload(size: int = PAYLOAD_BYTES) -> str:
    """A JSON payload of exactly `size` bytes."""
    head = '{"data": "'
    return head + "x" * max(0, size - len(head) - 2) + '"}'


@dataclass(frozen=True)
class DbWindow:
    start: datetime
    end: datetime

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


async def connect(url: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


async def clock(conn: psycopg.AsyncConnection[Any]) -> datetime:
    row = await (await conn.execute("SELECT clock_timestamp()")).fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


async def consumer_pks(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    rows = await (await conn.execute("SELECT consumer_id, pk FROM consumer")).fetchall()
    return {str(cid): int(pk) for cid, pk in rows}


async def scalar(conn: psycopg.AsyncConnection[Any], sql: str, params: Sequence[Any] = ()) -> Any:
    row = await (await conn.execute(sql, params)).fetchone()
    return None if row is None else row[0]


async def stored_token(conn: psycopg.AsyncConnection[Any], token: str) -> str:
    """A channel or producer token as the broker stores and compares it (a keyed hash under
    the key migration 0011 made; the bench sets no [http] token-hash-key)."""
    key = await scalar(conn, "SELECT value FROM broker_secret WHERE name = 'token-hash-key'")
    return TokenDigest(str(key).encode())(token)


async def queued(conn: psycopg.AsyncConnection[Any], consumer_pk: int) -> int:
    return int(
        await scalar(
            conn,
            "SELECT count(*) FROM job WHERE consumer_pk = %s AND status = 'QUEUED'",
            (consumer_pk,),
        )
    )


async def insert_jobs(
    conn: psycopg.AsyncConnection[Any],
    *,
    channel: str,
    producer: str,
    consumer_pks: Sequence[int],
    count: int,
    size: int = PAYLOAD_BYTES,
) -> None:
    """`count` new messages in `channel`, each fanned out to one QUEUED job per given consumer."""
    if count <= 0:
        return
    prefix = f"pre-{uuid.uuid4().hex[:12]}-"
    row = await (
        await conn.execute(
            """
            WITH inserted AS (
                INSERT INTO message (channel_id, message_id, producer_id, payload, content_type,
                                     priority, headers, received_at)
                SELECT %s, %s || g, %s, convert_to(%s, 'UTF8'), 'application/json', 0,
                       '{}'::json, now()
                  FROM generate_series(1, %s) AS g
                RETURNING pk
            )
            SELECT min(pk), max(pk) FROM inserted
            """,
            (channel, prefix, producer, payload(size), count),
        )
    ).fetchone()
    assert row is not None
    low, high = row
    for consumer_pk in consumer_pks:
        await conn.execute(
            """
            INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,
                             earliest_next_attempt_at, status_changed_at, created_at)
            SELECT m.pk, %s, 'QUEUED', 0, %s, now(), now(), now()
              FROM message AS m
             WHERE m.pk BETWEEN %s AND %s AND m.message_id LIKE %s
            """,
            (consumer_pk, size, low, high, prefix + "%"),
        )


async def recycle(conn: psycopg.AsyncConnection[Any], consumer_pk: int, limit: int) -> int:
    """Put up to `limit` finished or in-flight jobs of a consumer back in the queue.

    Cheaper than inserting new messages; the caller vacuums afterwards so every run starts
    from a table without the dead tuples the previous run left behind.
    """
    if limit <= 0:
        return 0
    cursor = await conn.execute(
        """
        UPDATE job
           SET status = 'QUEUED', attempt = 0, retry_count = 0, timeout_count = 0,
               lease_expires_at = NULL, claimed_at = NULL, dead_reason = NULL,
               earliest_next_attempt_at = now(), status_changed_at = now()
         WHERE id IN (SELECT id FROM job
                       WHERE consumer_pk = %s AND status IN ('INFLIGHT', 'DELIVERED', 'DEAD')
                       LIMIT %s)
        """,
        (consumer_pk, limit),
    )
    return int(cursor.rowcount)


async def ensure_backlog(
    conn: psycopg.AsyncConnection[Any],
    *,
    consumer_pk: int,
    need: int,
    channel: str,
    producer: str,
) -> int:
    """At least `need` QUEUED jobs for the consumer: recycle old ones first, insert the rest."""
    have = await queued(conn, consumer_pk)
    missing = need - have
    if missing > 0:
        missing -= await recycle(conn, consumer_pk, missing)
    if missing > 0:
        await insert_jobs(
            conn, channel=channel, producer=producer, consumer_pks=[consumer_pk], count=missing
        )
    return max(have, need)


async def vacuum(conn: psycopg.AsyncConnection[Any], *tables: str) -> None:
    for table in tables or ("job", "message"):
        await conn.execute(f"VACUUM (ANALYZE) {table}")


COUNTS = {
    # Jobs a consumer finished (ack, DELIVERED POST, push 2xx) inside the window.
    "delivered": "status = 'DELIVERED' AND status_changed_at >= %s AND status_changed_at < %s",
    # Jobs claimed inside the window, whatever happened to them afterwards.
    "claimed": "claimed_at >= %s AND claimed_at < %s",
    # Jobs created inside the window (a publish fans out into these).
    "created": "created_at >= %s AND created_at < %s",
}


async def count_jobs(
    conn: psycopg.AsyncConnection[Any],
    kind: str,
    consumer_pks: Sequence[int],
    window: DbWindow,
) -> int:
    sql = f"SELECT count(*) FROM job WHERE consumer_pk = ANY(%s) AND {COUNTS[kind]}"
    return int(await scalar(conn, sql, (list(consumer_pks), window.start, window.end)))


async def span_jobs(
    conn: psycopg.AsyncConnection[Any],
    kind: str,
    consumer_pks: Sequence[int],
    window: DbWindow,
) -> tuple[int, float]:
    """Jobs in the window and the seconds between the first and the last of them."""
    column = {"delivered": "status_changed_at", "claimed": "claimed_at", "created": "created_at"}[
        kind
    ]
    sql = (
        f"SELECT count(*), extract(epoch FROM max({column}) - min({column})) FROM job "
        f"WHERE consumer_pk = ANY(%s) AND {COUNTS[kind]}"
    )
    row = await (await conn.execute(sql, (list(consumer_pks), window.start, window.end))).fetchone()
    assert row is not None
    return int(row[0]), float(row[1] or 0.0)


async def delivery_latency(
    conn: psycopg.AsyncConnection[Any],
    consumer_pk: int,
    window: DbWindow,
    *,
    since: str = "claimed_at",
) -> dict[str, float]:
    """Claim-to-DELIVERED time of jobs delivered in the window (push), from the database;
    `since="created_at"`: from the job's creation (its publish)."""
    assert since in ("claimed_at", "created_at")
    sql = f"""
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d),
               percentile_cont(0.99) WITHIN GROUP (ORDER BY d), count(*)
          FROM (SELECT extract(epoch FROM status_changed_at - {since}) * 1000 AS d
                  FROM job WHERE consumer_pk = %s AND {COUNTS["delivered"]}) AS t
    """
    row = await (await conn.execute(sql, (consumer_pk, window.start, window.end))).fetchone()
    assert row is not None
    if not row[2]:
        return {"n": 0}
    return {"n": int(row[2]), "p50": round(float(row[0]), 3), "p99": round(float(row[1]), 3)}


# -- pg_stat_statements ---------------------------------------------------------------------------


async def statements_reset(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute("SELECT pg_stat_statements_reset()")


OWN_STATEMENTS = ("pg_stat_statements", "clock_timestamp()", "VACUUM", "count(*) FROM job")


async def statements(conn: psycopg.AsyncConnection[Any], dbname: str) -> list[dict[str, Any]]:
    """Every statement run in `dbname` since the last reset, busiest first (ours excluded)."""
    rows = await (
        await conn.execute(
            """
            SELECT s.query, s.calls, s.total_exec_time, s.rows, s.total_plan_time, s.plans
              FROM pg_stat_statements AS s
              JOIN pg_database AS d ON d.oid = s.dbid
             WHERE d.datname = %s
             ORDER BY s.total_exec_time DESC
            """,
            (dbname,),
        )
    ).fetchall()
    found = []
    for query, calls, total_ms, nrows, plan_ms, plans in rows:
        text = " ".join(str(query).split())
        if any(mark in text for mark in OWN_STATEMENTS):
            continue
        found.append(
            {
                "query": text[:240],
                "calls": int(calls),
                "total_ms": round(float(total_ms), 1),
                "mean_ms": round(float(total_ms) / max(int(calls), 1), 4),
                "plan_ms": round(float(plan_ms), 1),
                "plans": int(plans),
                "rows": int(nrows),
            }
        )
    return found


async def explain(
    conn: psycopg.AsyncConnection[Any],
    sql: str,
    params: Sequence[Any] | Mapping[str, Any] = (),
) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) inside a transaction that is rolled back."""
    async with conn.transaction(force_rollback=True):
        cursor = await conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
        return [str(row[0]) for row in await cursor.fetchall()]


@dataclass(frozen=True)
class FunctionQuery:
    """The query a PL/pgSQL function returns, as the database holds it (pg_proc.prosrc), its
    arguments made $1, $2 ..., and the settings the function runs it under (its SET clauses)."""

    name: str
    text: str
    arg_types: tuple[str, ...]
    settings: tuple[tuple[str, str], ...]


# `RETURN QUERY <query>;` or `RETURN <expression>;`, the body's last statement.
_RETURNED = re.compile(r"\bRETURN\s+(QUERY\s+)?(.*?);\s*END\b", re.IGNORECASE | re.DOTALL)


async def function_query(conn: psycopg.AsyncConnection[Any], name: str) -> FunctionQuery:
    """What `name` runs, read from the database: a copy kept here could drift from it."""
    row = await (
        await conn.execute(
            """
            SELECT p.prosrc, p.proargnames, p.proargmodes, p.proconfig,
                   ARRAY(SELECT format_type(t.oid, NULL)
                           FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS t(oid, n)
                          ORDER BY t.n)
              FROM pg_proc AS p WHERE p.proname = %s
            """,
            (name,),
        )
    ).fetchone()
    if row is None:
        raise LookupError(f"no function {name}")
    source, arg_names, arg_modes, config, arg_types = row
    found = _RETURNED.search(source)
    if found is None:
        raise ValueError(f"{name}: no RETURN statement in its body")
    query = found.group(2).strip()
    if not found.group(1):
        query = f"SELECT {query}"  # PL/pgSQL evaluates `RETURN expr` as SELECT expr
    # Input arguments come first in proargnames (modes i/b; no modes: all are inputs). With
    # `#variable_conflict use_column` a bare name is a variable only where no column has it,
    # and the bodies qualify their columns, so a name not after a dot is the argument.
    names = list(arg_names or [])
    modes = list(arg_modes or ["i"] * len(names))
    inputs = [arg for arg, mode in zip(names, modes, strict=True) if mode in ("i", "b")]
    for n, arg in enumerate(inputs, 1):
        query = re.sub(rf"(?<![.\w]){re.escape(arg)}\b", f"${n}", query)
    settings = tuple(
        (key, value) for key, _, value in (str(item).partition("=") for item in config or [])
    )
    return FunctionQuery(name, query, tuple(arg_types), settings)


async def explain_function(
    conn: psycopg.AsyncConnection[Any], name: str, args: Sequence[Any]
) -> list[str]:
    """The plan of the query inside function `name` for these arguments, planned as the
    function plans it: a prepared statement under the function's own settings (its
    plan_cache_mode makes that the generic plan), run by EXPLAIN (ANALYZE, BUFFERS) in a
    transaction that is rolled back. EXPLAIN of a call shows a Function Scan only."""
    walk = await function_query(conn, name)
    statement = pgsql.Identifier(f"bench_{name}_{uuid.uuid4().hex[:8]}")
    async with conn.transaction(force_rollback=True):
        for key, value in walk.settings:
            await conn.execute("SELECT set_config(%s, %s, true)", (key, value))
        types = pgsql.SQL(", ").join(pgsql.SQL(t) for t in walk.arg_types)
        await conn.execute(
            pgsql.SQL("PREPARE {} ({}) AS ").format(statement, types) + pgsql.SQL(walk.text)
        )
        values = pgsql.SQL(", ").join(pgsql.Literal(a) for a in args)
        cursor = await conn.execute(
            pgsql.SQL("EXPLAIN (ANALYZE, BUFFERS) EXECUTE {} ({})").format(statement, values)
        )
        plan = [str(row[0]) for row in await cursor.fetchall()]
        # A prepared statement is the session's: the rollback would leave it behind.
        await conn.execute(pgsql.SQL("DEALLOCATE {}").format(statement))
    return plan
