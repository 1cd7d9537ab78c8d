"""The claim is planned a few times per connection, not per call (issues 39 and 40).

PostgreSQL plans a statement anew until it is prepared on that connection (psycopg prepares it
on request or after a few runs) and has run it five times with custom plans. With the batch
size written into the text, every size was a statement of its own, prepared separately on each
pooled connection, and a pool that handed its connections out in turn kept every one of them
cold: a third to a half of the bridge's claims were planned. Counted by PostgreSQL itself
(pg_stat_statements, whose normalised text folds the sizes' texts into one entry), on a
throwaway cluster of the module's own (the suite's shared one runs without the extension).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack

import httpx
import psycopg
import pytest

from app.config import Config, load_config_text
from app.runtime import Runtime
from app.store.queue import claim_sql
from tests.helpers.pull import bulk_publish, consumer_pk, setup_channel
from tests.helpers.statements import counted_database

QUEUED = 2_000
_databases = itertools.count()


@pytest.fixture(scope="module")
def template() -> Iterator[tuple[str, str]]:
    """A cluster with pg_stat_statements and a migrated template database: (base url, name)."""
    with counted_database("claim_plans") as (cluster, _url):
        yield cluster.base_url, "claim_plans"


@pytest.fixture
def database(template: tuple[str, str]) -> Iterator[str]:
    base, name = template
    fresh = f"claim_plans_{next(_databases)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {fresh} TEMPLATE {name}")
    yield base.rpartition("/")[0] + "/" + fresh
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {fresh} WITH (FORCE)")


@pytest.fixture
def config(database: str) -> Config:
    # The default pool (10 kept, 20 at most), as the bridge and the API run with it.
    return load_config_text(f"[rdbms]\ndialect=postgresql\nconnection-url={database}\n")


@pytest.fixture
async def stats(runtime: Runtime, database: str) -> AsyncIterator[psycopg.AsyncConnection]:
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:
        yield conn


async def claim_counts(conn: psycopg.AsyncConnection) -> tuple[int, int, int]:
    """(entries, calls, plans) of the claim statements run in this database since the reset."""
    cursor = await conn.execute(
        "SELECT count(*), coalesce(sum(calls), 0), coalesce(sum(plans), 0)"
        " FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND query LIKE '%claimable_jobs(%' AND query NOT LIKE '%pg_stat_statements%'"
    )
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


async def reset(conn: psycopg.AsyncConnection) -> None:
    await conn.execute(
        "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
        " WHERE datname = current_database()), 0)"
    )


async def pull(client: httpx.AsyncClient, base: str, auth: dict[str, str], batch: int) -> None:
    r = await client.post(f"{base}/pull", json={"batch": batch, "no_wait": True}, headers=auth)
    assert r.status_code == 200, r.text
    assert len(r.json()["Jobs"]) == batch


async def test_pulls_of_every_batch_size_share_one_claim_statement(
    client: httpx.AsyncClient, runtime: Runtime, stats: psycopg.AsyncConnection
) -> None:
    (k1,) = await setup_channel(client)
    await bulk_publish(runtime, QUEUED)
    await reset(stats)
    sizes, rounds = range(1, 11), 4
    for _ in range(rounds):
        for batch in sizes:
            await pull(client, k1.base, k1.auth, batch)
    entries, calls, plans = await claim_counts(stats)
    assert (entries, calls) == (1, len(sizes) * rounds)
    # One text: prepared at its first run, five custom plans, then the generic one, on each
    # connection it ran on (one or two: the requests come one at a time). A text per size
    # ran four times each, every time planned.
    assert plans <= 12, f"{plans} plans for {calls} claims"


async def test_the_pool_hands_out_the_connection_returned_last(
    client: httpx.AsyncClient, runtime: Runtime, stats: psycopg.AsyncConnection
) -> None:
    (k1,) = await setup_channel(client)
    await bulk_publish(runtime, QUEUED)
    # Six connections open in the pool, as a burst leaves them.
    async with AsyncExitStack() as stack:
        for _ in range(6):
            await stack.enter_async_context(runtime.db.engine.connect())
    await reset(stats)
    for _ in range(30):
        await pull(client, k1.base, k1.auth, 10)
    _, calls, plans = await claim_counts(stats)
    assert calls == 30
    # Handed out in turn, each of the six saw five claims, every one of them planned.
    assert plans <= 12, f"{plans} plans for {calls} claims"


def _node_lines(plan: list[str]) -> list[str]:
    """The plan's nodes and their order, without the values conditions compare with."""
    return [re.sub(r"\$\d+|'[^']*'::\w+", "?", line) for line in plan]


@pytest.mark.parametrize(
    "numbered,by_bytes,capped", [(False, False, False), (True, False, False), (False, True, True)]
)
async def test_the_generic_plan_is_the_custom_plan(
    client: httpx.AsyncClient,
    runtime: Runtime,
    stats: psycopg.AsyncConnection,
    numbered: bool,
    by_bytes: bool,
    capped: bool,
) -> None:
    # A generic plan that differed (a LIMIT $n priced for a tenth of the table, say) would be
    # either kept and slow or never chosen; the claim's walk and its LIMIT are planned inside
    # claimable_jobs (migration 0010), so the statement's own plan cannot depend on the size.
    await setup_channel(client)
    await bulk_publish(runtime, QUEUED)
    await stats.execute("ANALYZE")
    values = {
        "consumer_pk": await consumer_pk(runtime, "k1"),
        "consumer_type": "pull",
        "limit": 100,
        "default_ack_wait": 30,
        "incremental_timeout": 0,
        "max_bytes": 10_000,
    }
    names: list[str] = []

    def numbered_parameter(m: re.Match[str]) -> str:
        if m[1] not in names:
            names.append(m[1])
        return f"${names.index(m[1]) + 1}"

    sql = claim_sql("pk", numbered=numbered, by_bytes=by_bytes, capped=capped)
    prepared = re.sub(r"%\((\w+)\)s", numbered_parameter, sql).replace("%%", "%")
    args = ", ".join(
        f"'{values[n]}'" if isinstance(values[n], str) else str(values[n]) for n in names
    )
    await stats.execute(f"PREPARE claim AS {prepared}")
    plans = {}
    for mode in ("force_custom_plan", "force_generic_plan"):
        await stats.execute(f"SET plan_cache_mode = {mode}")
        cursor = await stats.execute(f"EXPLAIN (COSTS OFF) EXECUTE claim({args})")
        plans[mode] = _node_lines([str(row[0]) for row in await cursor.fetchall()])
    assert plans["force_generic_plan"] == plans["force_custom_plan"]
    assert any("Function Scan on claimable_jobs" in line for line in plans["force_generic_plan"])
    # Left to choose, PostgreSQL settles on the generic plan after its five custom ones.
    await stats.execute("SET plan_cache_mode = auto")
    for _ in range(7):
        async with stats.transaction(force_rollback=True):
            await stats.execute(f"EXECUTE claim({args})")
    cursor = await stats.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'claim'"
    )
    generic, custom = await cursor.fetchone() or (0, 0)
    assert generic >= 3 and custom <= 5, (generic, custom)
