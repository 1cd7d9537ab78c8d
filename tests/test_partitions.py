"""The job and message tables' partitions on PostgreSQL (app/store/partitions.py,
app/services/retention.py): made ahead and rotated, the unfinished jobs of an old one moved
forward and still delivered once, the old one dropped after its export whatever step a crash
stopped at, a message partition dropped once archived and no job points into it, message ids
unique over every partition, the hot statements reaching only the partitions they must, and
the migration of tables with rows."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from alembic import command
from sqlalchemy import select

from app.config import DatabaseConfig, load_config_text
from app.metrics import Metrics
from app.runtime import Runtime
from app.services.retention import RetentionService, RoundReport
from app.store import attempts, messages, queue, upkeep
from app.store.bridge import BridgeStore
from app.store.ledger import LedgerStore
from app.store.migrate import alembic_config, upgrade
from app.store.partitions import SPAN, PartitionStore
from app.store.schema import message
from devtools.pg import free_port
from tests.helpers.message_partitions import (
    HOLD,
    both_intervals_over,
    interval_over,
    message_state,
    retention,
    sql,
)
from tests.helpers.pull import (
    PullConsumer,
    consumer_pk,
    producer_headers,
    publish,
    pull_jobs,
    set_state,
    setup_channel,
)
from tests.helpers.waiting import eventually


@pytest.fixture
def backend() -> str:
    return "postgresql"  # SQLite keeps one table: test_sqlite_keeps_one_table


async def leaves(rt: Runtime) -> list[str]:
    rows = await sql(
        rt,
        "SELECT relid::regclass::text FROM pg_partition_tree('job') WHERE isleaf ORDER BY 1",
    )
    return [r[0] for r in rows]


async def where(rt: Runtime, job_id: int) -> str:
    rows = await sql(rt, "SELECT tableoid::regclass::text FROM job WHERE id = :id", id=job_id)
    return str(rows[0][0])


async def counts_match_rows(rt: Runtime) -> None:
    counted = dict(
        await sql(
            rt,
            "SELECT status, sum(n) FROM job_count GROUP BY status HAVING sum(n) <> 0",
        )
    )
    rows = dict(await sql(rt, "SELECT status, count(*) FROM job GROUP BY status"))
    assert {k: int(v) for k, v in counted.items()} == {k: int(v) for k, v in rows.items()}


async def unaccounted(rt: Runtime) -> dict[str, int]:
    async with rt.db.transaction() as tx:
        return {e.consumer_id: e.unaccounted for e in await LedgerStore(tx).entries()}


async def test_partitions_are_made_ahead_and_ids_rotate_into_them(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(client)
    service = retention(runtime)
    assert await leaves(runtime) == ["job_p0"]
    await service.maintain()
    assert await leaves(runtime) == ["job_p0", "job_p1"]  # ahead, empty
    await service.maintain()  # nothing more to do before the interval ends
    assert await leaves(runtime) == ["job_p0", "job_p1"]
    await publish(client, "before")
    (before,) = await pull_jobs(client, k1)
    assert int(before["ID"]) < SPAN and await where(runtime, int(before["ID"])) == "job_p0"

    await interval_over(runtime)
    await service.maintain()
    assert await leaves(runtime) == ["job_p0", "job_p1", "job_p2"]
    states = {
        r[0]: (r[1] is not None, r[2] is not None)
        for r in await sql(runtime, "SELECT name, opened_at, closed_at FROM job_partition")
    }
    assert states == {
        "job_p0": (True, True),
        "job_p1": (True, False),
        "job_p2": (False, False),
    }
    await publish(client, "after")
    (after,) = await pull_jobs(client, k1)
    assert SPAN <= int(after["ID"]) < 2 * SPAN
    assert await where(runtime, int(after["ID"])) == "job_p1"
    # Both acked by id, each in its own partition.
    for j in (before, after):
        r = await set_state(client, k1, j["ID"], {"NextState": "DELIVERED"})
        assert r.status_code == 202, r.text
    await counts_match_rows(runtime)


async def _churn(client: httpx.AsyncClient, who: PullConsumer, count: int) -> None:
    """Jobs published, claimed and acked: two dead row versions each."""
    for n in range(count):
        await publish(client, f"churn{n}")
    for job in await pull_jobs(client, who, batch=count):
        r = await set_state(client, who, job["ID"], {"NextState": "DELIVERED"})
        assert r.status_code == 202, r.text


async def _vacuum_stats(rt: Runtime, name: str) -> tuple[int, int]:
    rows = await sql(
        rt,
        "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables WHERE relname = :name",
        name=name,
    )
    return int(rows[0][0]), int(rows[0][1])


async def test_the_sweeper_vacuums_only_the_partitions_holding_dead_jobs(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """A closed partition whose jobs have all finished changes no more: once vacuumed, it is
    left alone, and only the partition taking jobs is vacuumed again."""
    (k1,) = await setup_channel(client)
    service = retention(runtime)
    await service.maintain()
    await _churn(client, k1, 10)

    async def dead_in(name: str) -> bool:
        # Backends report their statistics within seconds, not at once.
        return (await _vacuum_stats(runtime, name))[0] >= 20

    await eventually(lambda: dead_in("job_p0"), 20, 0.2, what="job_p0's dead row versions")
    assert await runtime.sweeps.vacuum_if_needed(20)
    dead, vacuumed = await _vacuum_stats(runtime, "job_p0")
    assert dead == 0 and vacuumed >= 1

    await interval_over(runtime)
    await service.maintain()  # job_p0 closed, job_p1 takes the jobs
    await _churn(client, k1, 10)
    await eventually(lambda: dead_in("job_p1"), 20, 0.2, what="job_p1's dead row versions")
    p1_before = (await _vacuum_stats(runtime, "job_p1"))[1]
    assert await runtime.sweeps.vacuum_if_needed(20)
    assert await _vacuum_stats(runtime, "job_p0") == (0, vacuumed)
    assert (await _vacuum_stats(runtime, "job_p1"))[1] == p1_before + 1
    # Nothing dead anywhere: nothing is vacuumed (a VACUUM naming no table would take the
    # whole database).
    assert not await runtime.sweeps.vacuum_if_needed(0)
    # A partition dropped between the statistics and its vacuum is passed over.
    await upkeep.vacuum_jobs(runtime.db, ["job_p0", "job_gone_meanwhile", "job_p1"])
    assert (await _vacuum_stats(runtime, "job_p1"))[1] == p1_before + 2


async def test_a_second_sweeper_makes_nothing_twice(runtime: Runtime) -> None:
    a, b = retention(runtime), retention(runtime)
    await asyncio.gather(a.maintain(), b.maintain())
    await interval_over(runtime)
    await asyncio.gather(a.maintain(), b.maintain())
    assert await leaves(runtime) == ["job_p0", "job_p1", "job_p2"]
    position = await PartitionStore(runtime.db).position()
    assert position == SPAN  # one jump, to the first id of job_p1


async def test_unfinished_jobs_move_forward_and_are_delivered_once(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(client)
    payloads = [f"m{i}" for i in range(8)]
    for p in payloads:
        await publish(client, p)
    pulled = await pull_jobs(client, k1, batch=8)
    ids = sorted(int(j["ID"]) for j in pulled)
    # Four delivered, one dead (in the DLQ), one queued again and due, one in flight; one
    # scheduled message's job waits for tomorrow.
    for job_id in ids[:4]:
        r = await set_state(client, k1, job_id, {"NextState": "DELIVERED"})
        assert r.status_code == 202, r.text
    await sql(runtime, "UPDATE job SET status = 'DEAD' WHERE id = :id", id=ids[4])
    await sql(
        runtime,
        "UPDATE job SET status = 'QUEUED', earliest_next_attempt_at = now() WHERE id = ANY(:ids)",
        ids=ids[5:7],
    )
    inflight = ids[7]
    scheduled = await publish_scheduled(client)
    service = retention(runtime)
    await service.maintain()
    await interval_over(runtime)
    await service.maintain()  # job_p0 closed; retention 0 days: its time has come

    # Round 1 moves the dead and the scheduled jobs and holds the two due ones; round 2 moves
    # them. The job in flight stays (its ack finds it by id).
    first = await service.drain()
    assert (first.moved, first.held) == (2, 2), first
    assert await pull_jobs(client, k1) == []  # held: not due
    second = await service.drain()
    assert (second.moved, second.held) == (2, 0), second
    old = await sql(runtime, "SELECT id, status FROM job_p0 WHERE status <> 'DELIVERED'")
    assert old == [(inflight, "INFLIGHT")]
    assert await service.ready() == []  # one in flight: not yet

    moved = await eventually(
        lambda: pull_jobs(client, k1, batch=10), timeout=10, what="the held jobs due again"
    )
    assert len(moved) == 2 and all(int(j["ID"]) >= SPAN for j in moved)
    r = await set_state(client, k1, inflight, {"NextState": "DELIVERED"})
    assert r.status_code == 202, r.text
    for j in moved:
        r = await set_state(client, k1, j["ID"], {"NextState": "DELIVERED"})
        assert r.status_code == 202, r.text
    dead = await sql(runtime, "SELECT id FROM job WHERE status = 'DEAD'")
    assert len(dead) == 1 and dead[0][0] >= SPAN
    waiting = await sql(
        runtime,
        "SELECT j.id FROM job j JOIN message m ON m.pk = j.message_pk WHERE m.message_id = :m",
        m=scheduled,
    )
    assert len(waiting) == 1 and waiting[0][0] >= SPAN

    # Every message's job delivered once: the four, the in-flight one and the two moved.
    delivered = await sql(
        runtime,
        "SELECT convert_from(m.payload, 'UTF8'), count(*) FROM job j"
        " JOIN message m ON m.pk = j.message_pk WHERE j.status = 'DELIVERED' GROUP BY 1",
    )
    assert sorted(p for p, n in delivered if n == 1) == sorted(
        payloads[i] for i in (0, 1, 2, 3, 5, 6, 7)
    )
    assert all(n == 1 for _, n in delivered)
    await counts_match_rows(runtime)
    assert set((await unaccounted(runtime)).values()) == {0}

    # Only delivered jobs left: ready for the archive; after it, detached and dropped.
    (ready,) = await service.ready()
    assert ready.name == "job_p0"
    assert await service.store.mark_exported("job_p0", 5)
    report = await service.finish_exported()
    assert report.dropped == ["job_p0"]
    assert "job_p0" not in await leaves(runtime)
    await counts_match_rows(runtime)
    assert set((await unaccounted(runtime)).values()) == {0}
    removed = await sql(runtime, "SELECT sum(n) FROM job_removed")
    assert removed[0][0] == 5


async def publish_scheduled(client: httpx.AsyncClient) -> str:
    r = await client.post(
        "/channel/c1/broadcast",
        content=b"tomorrow",
        headers=producer_headers(**{"X-Broker-Scheduled-For": "2099-01-01T00:00:00Z"}),
    )
    assert r.status_code == 201, r.text
    return r.headers["Location"].rsplit("/", 1)[1]


async def closed_and_exported(client: httpx.AsyncClient, runtime: Runtime) -> RetentionService:
    """job_p0 with three delivered jobs, closed and exported."""
    (k1,) = await setup_channel(client)
    for i in range(3):
        await publish(client, f"x{i}")
    for j in await pull_jobs(client, k1, batch=3):
        r = await set_state(client, k1, j["ID"], {"NextState": "DELIVERED"})
        assert r.status_code == 202, r.text
    service = retention(runtime)
    await service.maintain()
    await interval_over(runtime)
    await service.maintain()
    assert [p.name for p in await service.ready()] == ["job_p0"]
    assert await service.store.mark_exported("job_p0", 3)
    return service


async def state_of(rt: Runtime, name: str) -> str:
    rows = await sql(rt, "SELECT status FROM job_partition WHERE name = :n", n=name)
    return str(rows[0][0])


async def test_a_detach_interrupted_half_way_is_finished_by_the_next_round(
    client: httpx.AsyncClient, runtime: Runtime, config: Any
) -> None:
    service = await closed_and_exported(client, runtime)
    url = config.database.connection_url
    # DETACH ... CONCURRENTLY waits for transactions older than its first step; one holds a
    # snapshot of job_p0, and the detach is cancelled while waiting: a crash's state, the
    # partition marked detach-pending.
    async with (
        await psycopg.AsyncConnection.connect(url) as older,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as detacher,
    ):
        await older.execute("SELECT count(*) FROM job")
        detaching = asyncio.create_task(
            detacher.execute("ALTER TABLE job DETACH PARTITION job_p0 CONCURRENTLY")
        )
        await eventually(lambda: pending(runtime), timeout=10, what="the detach half way (pending)")
        detacher.cancel()
        with pytest.raises(psycopg.errors.QueryCanceled):
            await detaching
        await older.rollback()
    assert await pending(runtime)
    assert await state_of(runtime, "job_p0") == "EXPORTED"
    report = await service.finish_exported()
    assert report.dropped == ["job_p0"]
    assert await leaves(runtime) == ["job_p1", "job_p2"]
    assert await state_of(runtime, "job_p0") == "DROPPED"
    await counts_match_rows(runtime)
    assert set((await unaccounted(runtime)).values()) == {0}


async def pending(rt: Runtime) -> bool:
    rows = await sql(
        rt,
        "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass('job_p0')",
    )
    return bool(rows and rows[0][0])


async def test_a_crash_between_detach_and_drop_is_finished_by_the_next_round(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    service = await closed_and_exported(client, runtime)
    await service.store.detach("job_p0")  # and the process dies here
    assert await state_of(runtime, "job_p0") == "DETACHED"
    assert "job_p0" not in await leaves(runtime)
    # Meanwhile the counts still hold the detached jobs, as the ledger does.
    assert set((await unaccounted(runtime)).values()) == {0}
    report = await service.finish_exported()
    assert (report.detached, report.dropped) == ([], ["job_p0"])
    assert (await sql(runtime, "SELECT to_regclass('job_p0')"))[0][0] is None
    await counts_match_rows(runtime)
    assert set((await unaccounted(runtime)).values()) == {0}
    assert (await service.finish_exported()).dropped == []  # and once only


async def test_a_job_woken_after_the_export_survives_the_drop(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    service = await closed_and_exported(client, runtime)
    # A replay (redrive of delivered jobs) between the export and the detach: the job is
    # QUEUED in the detached table, and the drop puts it back into job with a new id.
    (woken,) = await sql(runtime, "SELECT min(id) FROM job_p0")
    await sql(runtime, "UPDATE job SET status = 'QUEUED' WHERE id = :id", id=woken[0])
    report = await service.finish_exported()
    assert report.dropped == ["job_p0"]
    rows = await sql(runtime, "SELECT id FROM job WHERE status = 'QUEUED'")
    assert len(rows) == 1 and rows[0][0] >= SPAN
    await counts_match_rows(runtime)
    assert set((await unaccounted(runtime)).values()) == {0}
    removed = await sql(runtime, "SELECT sum(n) FROM job_removed")
    assert removed[0][0] == 2


# -- plans -------------------------------------------------------------------------------------

PER_PARTITION = 20_000


async def many_jobs(rt: Runtime, prefix: str, count: int) -> None:
    """`count` messages of c1 and their jobs, in two statements."""
    await sql(
        rt,
        "INSERT INTO message (channel_id, message_id, producer_id, payload, content_type,"
        " priority, headers, received_at)"
        " SELECT 'c1', :prefix || g, 'p1', convert_to('job-' || g, 'UTF8'), 'text/plain', 0,"
        " '{}'::json, now() FROM generate_series(1, :n) AS g",
        prefix=prefix,
        n=count,
    )
    await sql(
        rt,
        "INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,"
        " earliest_next_attempt_at, status_changed_at, created_at)"
        " SELECT m.pk, c.pk, 'QUEUED', 0, length(m.payload), now(), now(), now()"
        " FROM message m JOIN consumer c ON c.channel_id = m.channel_id"
        " WHERE m.message_id LIKE :prefix || '%%'",
        prefix=prefix,
    )
    await sql(
        rt,
        "INSERT INTO message_key (channel_id, message_id, message_pk)"
        " SELECT channel_id, message_id, pk FROM message WHERE message_id LIKE :prefix || '%%'",
        prefix=prefix,
    )


def _numbered(statement: str) -> tuple[str, list[str]]:
    """%(name)s placeholders as $n (PREPARE's), and the names in their order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, statement).replace("%%", "%"), names


def _partitions_reached(plan: Any, prefix: str = "job_p") -> set[str]:
    """Partitions of job (or another table) the executed plan read (loops > 0)."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        name = node.get("Relation Name", "")
        if name.startswith(prefix) and node.get("Actual Loops", 0) > 0:
            found.add(name)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return found


def _rows_written(plan: Any) -> int:
    """Rows the plan's ModifyTable nodes on job wrote."""

    def walk(node: Any) -> int:
        own = (
            node.get("Actual Rows", 0)
            if node.get("Node Type") == "ModifyTable" and (node.get("Relation Name") == "job")
            else 0
        )
        return own + sum(walk(child) for child in node.get("Plans", []))

    return walk(plan[0]["Plan"])


async def _explain(
    rt: Runtime, statement: str, params: dict[str, Any], prefix: str = "job_p"
) -> tuple[set[str], int]:
    """The statement prepared and run (then rolled back) with its generic plan, as the broker's
    connections end up running it, and the partitions (of job, or whose names start with
    `prefix`) that plan reached."""
    numbered, names = _numbered(statement)
    values = ", ".join(_literal(params[n]) for n in names)
    async with rt.db.transaction() as tx:
        await tx.conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
        await tx.conn.exec_driver_sql(f"PREPARE probe AS {numbered}".replace("%", "%%"))
        try:
            plan = (
                await tx.conn.exec_driver_sql(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE probe({values})".replace("%", "%%")
                )
            ).scalar_one()
        finally:
            await tx.conn.exec_driver_sql("DEALLOCATE probe")
        await tx.conn.rollback()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return _partitions_reached(plan, prefix), _rows_written(plan)


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


async def test_acks_claims_and_publishes_reach_only_the_partitions_they_must(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(client)
    service = retention(runtime)
    for round_ in range(3):  # three partitions with jobs: p0, p1, p2 (and p3 ahead)
        await many_jobs(runtime, f"r{round_}-", PER_PARTITION)
        await service.maintain()
        await both_intervals_over(runtime)  # and their messages in message_p0, p1, p2
        await service.maintain()
    # Sizes the statistics see: on a few rows a hash join over a whole index is the cheaper
    # plan for a batch of acks, whatever the partitioning.
    await runtime.db.run_alone("ANALYZE job, message, message_key", {}, prepare=False)
    assert await leaves(runtime) == ["job_p0", "job_p1", "job_p2", "job_p3", "job_p4"]
    pk = await consumer_pk(runtime, k1.id)
    claimed = await sql(runtime, "SELECT id FROM job WHERE id >= :low ORDER BY id", low=SPAN)
    one = claimed[0][0]
    await sql(runtime, "UPDATE job SET status = 'INFLIGHT' WHERE id = :id", id=one)
    kept = attempts.DEFAULT_KEPT
    single = await _explain(
        runtime,
        queue.ack_sql("pk", True, kept),
        {"consumer_pk": pk, "consumer_type": "pull", "id": one, "attempt": None},
    )
    assert single == ({"job_p1"}, 1)
    batch = await _explain(
        runtime,
        queue.ack_sql("pk", False, kept),
        {
            "consumer_pk": pk,
            "consumer_type": "pull",
            "ids": queue.int_array([one, one + 1]),
            "attempts": queue.int_array([None, None]),
        },
    )
    assert batch == ({"job_p1"}, 1)
    # The claim's walk (claimable_jobs) goes through every attached partition's claim index,
    # as it must (any may hold queued jobs until drained); its update reaches only the
    # partition of the jobs it took.
    await sql(runtime, "UPDATE job SET status = 'DELIVERED' WHERE id < :low", low=2 * SPAN)
    claim_params = {
        "consumer_pk": pk,
        "consumer_type": "pull",
        "incremental_timeout": 0,
        "default_ack_wait": 30,
        "limit": 3,
    }
    claim_sql = queue.claim_sql("pk", numbered=False, by_bytes=False, capped=True)
    claim = await _explain(runtime, claim_sql, claim_params)
    assert claim == ({"job_p2"}, 3)
    # Its read of the jobs' messages (by pk) reaches only their partition.
    claimed_messages = await _explain(runtime, claim_sql, claim_params, "message_p")
    assert claimed_messages[0] == {"message_p2"}
    # A publish inserts into the partition taking ids and reads no job partition.
    probe = {
        "producer_id": "p1",
        "channel_id": "c1",
        "channel_token": runtime.tokens.digest("channel-token"),
        "producer_token": runtime.tokens.digest("producer-token"),
        "message_id": f"probe-{uuid.uuid4().hex}",
        "payload": "probe",
        "content_type": "text/plain",
        "priority": 0,
        "headers": "{}",
        "scheduled_for": None,
        "payload_size": 5,
    }
    published = await _explain(runtime, queue.PUBLISH, probe)
    assert published == (set(), 1)
    # Nor any message partition: the duplicate check is message_key's index, the insert goes
    # straight to the partition taking pks.
    published_messages = await _explain(runtime, queue.PUBLISH, probe, "message_p")
    assert published_messages[0] == set()
    # A repeated id (of a message in message_p0) writes nothing and reads no partition.
    repeated = await _explain(runtime, queue.PUBLISH, {**probe, "message_id": "r0-7"}, "message_p")
    assert repeated == (set(), 0)
    # A read by message id finds the pk in message_key, then reads one partition.
    for message_id, partition in (("r0-5", "message_p0"), ("r2-9", "message_p2")):
        by_id = select(message).where(message.c.pk == messages.pk_of("c1", message_id))
        compiled = by_id.compile(dialect=runtime.db.engine.dialect)
        read = await _explain(runtime, str(compiled), dict(compiled.params), "message_p")
        assert read[0] == {partition}


# -- the migration -----------------------------------------------------------------------------


@pytest.fixture
def migrated_to_0017(pg_base_url: str) -> Iterator[DatabaseConfig]:
    """A database at the revision before the job table's partitions, with jobs in it."""
    name = f"wb_partmig_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = f"{pg_base_url.rpartition('/')[0]}/{name}"
    database = load_config_text(f"[rdbms]\ndialect=postgresql\nconnection-url={url}\n").database
    try:
        upgrade(database, "0017_consumer_backfill")
        yield database
    finally:
        with psycopg.connect(pg_base_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


SEED = [
    "INSERT INTO channel (id, name, token, created_at, updated_at)"
    " VALUES ('c1', 'c1', 't', now(), now())",
    "INSERT INTO producer (id, name, token, created_at, updated_at)"
    " VALUES ('p1', 'p1', 't', now(), now())",
    "INSERT INTO consumer (channel_id, consumer_id, name, token, type, created_at, updated_at)"
    " SELECT 'c1', 'k' || g, 'k' || g, 't', 'pull', now(), now() FROM generate_series(1, 2) g",
    "INSERT INTO message (channel_id, message_id, producer_id, payload, content_type, headers,"
    " received_at) SELECT 'c1', 'm' || g, 'p1', 'x', 'text/plain', '{}', now()"
    " FROM generate_series(1, 500) g",
    "INSERT INTO job (message_pk, consumer_pk, status, earliest_next_attempt_at,"
    " status_changed_at, created_at)"
    " SELECT m.pk, c.pk, (ARRAY['QUEUED', 'INFLIGHT', 'DELIVERED', 'DEAD'])[m.pk % 4 + 1],"
    " now(), now(), now() FROM message m CROSS JOIN consumer c",
]
JOBS = "SELECT * FROM job ORDER BY id"
MESSAGES = "SELECT pk, channel_id, message_id, payload FROM message ORDER BY pk"
COUNTS = (
    "SELECT consumer_pk, status, sum(n) FROM job_count"
    " GROUP BY 1, 2 HAVING sum(n) <> 0 ORDER BY 1, 2"
)


def test_the_migration_keeps_every_row_and_the_counts(migrated_to_0017: DatabaseConfig) -> None:
    url = migrated_to_0017.connection_url
    with psycopg.connect(url) as conn:
        for statement in SEED:
            conn.execute(statement)
        jobs, counts = conn.execute(JOBS).fetchall(), conn.execute(COUNTS).fetchall()
        stored = conn.execute(MESSAGES).fetchall()
    assert len(jobs) == 1000

    upgrade(migrated_to_0017)

    with psycopg.connect(url) as conn:
        assert conn.execute(JOBS).fetchall() == jobs
        assert conn.execute(COUNTS).fetchall() == counts
        assert conn.execute("SELECT pg_get_partkeydef('job'::regclass)").fetchone() == (
            "RANGE (id)",
        )
        parts = conn.execute(
            "SELECT name, lower_id, upper_id, status FROM job_partition"
        ).fetchall()
        assert parts == [("job_p0", None, SPAN, "ATTACHED")]
        # The message table too, its ids in message_key, still unique.
        assert conn.execute(MESSAGES).fetchall() == stored
        assert conn.execute("SELECT pg_get_partkeydef('message'::regclass)").fetchone() == (
            "RANGE (pk)",
        )
        parts = conn.execute(
            "SELECT name, lower_id, upper_id, status FROM message_partition"
        ).fetchall()
        assert parts == [("message_p0", None, SPAN, "ATTACHED")]
        keys = conn.execute(
            "SELECT message_pk, channel_id, message_id FROM message_key ORDER BY message_pk"
        ).fetchall()
        assert keys == [(pk, channel, message_id) for pk, channel, message_id, _ in stored]
        with pytest.raises(psycopg.errors.UniqueViolation), conn.transaction():
            conn.execute(
                "INSERT INTO message_key (channel_id, message_id, message_pk)"
                " SELECT 'c1', 'm2', max(pk) FROM message"
            )
        # The sequence goes on where it was; new jobs counted by the triggers on job.
        row = conn.execute(
            "INSERT INTO job (message_pk, consumer_pk, status, earliest_next_attempt_at,"
            " status_changed_at, created_at) SELECT min(pk), (SELECT min(pk) FROM consumer),"
            " 'QUEUED', now(), now(), now() FROM message RETURNING id, tableoid::regclass::text"
        ).fetchone()
        assert row == (max(j[0] for j in jobs) + 1, "job_p0")
        queued = conn.execute("SELECT sum(n) FROM job_count WHERE status = 'QUEUED'").fetchone()
        assert queued == (sum(n for _, s, n in counts if s == "QUEUED") + 1,)
        # No foreign key points at message (migration 0021: the statements that delete a
        # message delete its jobs and key), and every job still has its message.
        referencing = conn.execute(
            "SELECT count(*) FROM pg_constraint"
            " WHERE contype = 'f' AND confrelid = 'message'::regclass"
        ).fetchone()
        assert referencing == (0,)
        orphans = conn.execute(
            "SELECT count(*) FROM job WHERE message_pk NOT IN (SELECT pk FROM message)"
        ).fetchone()
        assert orphans == (0,)
        conn.execute("DELETE FROM job WHERE id = %s", (row[0],))
        jobs_after = conn.execute(JOBS).fetchall()
        messages_after = conn.execute(MESSAGES).fetchall()

    command.downgrade(alembic_config(migrated_to_0017), "0017_consumer_backfill")
    with psycopg.connect(url) as conn:
        assert conn.execute(JOBS).fetchall() == jobs_after
        assert conn.execute(MESSAGES).fetchall() == messages_after
        assert conn.execute("SELECT to_regclass('job_partition')").fetchone() == (None,)
        assert conn.execute("SELECT to_regclass('message_key')").fetchone() == (None,)
        with pytest.raises(psycopg.errors.UniqueViolation), conn.transaction():
            conn.execute(
                "INSERT INTO message (channel_id, message_id, producer_id, payload,"
                " content_type, headers, received_at)"
                " VALUES ('c1', 'm2', 'p1', 'x', 'text/plain', '{}', now())"
            )


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_sqlite_keeps_one_table(client: httpx.AsyncClient, runtime: Runtime) -> None:
    (k1,) = await setup_channel(client)
    await publish(client, "one", message_id="only")
    service = retention(runtime)
    report = await service.run_round()
    assert (report.created, report.rotated_to, report.moved) == ([], None, 0)
    assert await sql(runtime, "SELECT count(*) FROM job_partition") == [(0,)]
    assert await sql(runtime, "SELECT count(*) FROM message_partition") == [(0,)]
    assert len(await pull_jobs(client, k1)) == 1
    # message_key is the duplicate check here too: a repeated id is refused and leaves no
    # message behind; a read by id finds the message.
    r = await client.post(
        "/channel/c1/broadcast",
        content=b"again",
        headers=producer_headers(**{"X-Broker-Message-ID": "only"}),
    )
    assert r.status_code == 409, r.text
    assert await sql(runtime, "SELECT count(*) FROM message") == [(1,)]
    assert (await client.get("/channel/c1/message/only")).json()["Payload"] == "one"


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("1d", 86400.0), ("12h", 43200.0), ("30m", 1800.0), ("off", 0.0), ("0", 0.0)],
)
def test_the_interval_key(raw: str, seconds: float) -> None:
    section = f"[rdbms]\npartition-interval={raw}\n"
    assert load_config_text(section).database.partition_interval_seconds == seconds


async def test_claims_go_on_while_a_partition_is_drained(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    # Workers pull and ack a backlog in an old partition while the sweeper's rounds hold and
    # move it: no pull or ack fails (a claim never meets a moved row) and each message is
    # delivered once.
    (k1,) = await setup_channel(client)
    await many_jobs(runtime, "old-", 600)
    service = RetentionService(runtime.db, 3600, 0, hold_seconds=0.3, chunk=50)
    await service.maintain()
    await interval_over(runtime)
    await service.maintain()
    delivered: list[str] = []
    failures: list[str] = []

    async def worker() -> None:
        while len(delivered) < 600:
            r = await client.post(
                f"{k1.base}/pull", json={"batch": 10, "no_wait": True}, headers=k1.auth
            )
            if r.status_code != 200:
                failures.append(f"pull {r.status_code} {r.text}")
                return
            jobs = r.json()["Jobs"]
            if not jobs:
                await asyncio.sleep(0.02)  # a poll: the held jobs come due within 0.3 s
                continue
            acks = [{"id": j["ID"], "attempt": j["Attempt"]} for j in jobs]
            r = await client.post(f"{k1.base}/ack", json={"acks": acks}, headers=k1.auth)
            if r.status_code != 200 or any(o["status"] != 202 for o in r.json()["Results"]):
                failures.append(f"ack {r.status_code} {r.text}")
                return
            delivered.extend(str(j["ID"]) for j in jobs)

    async def sweeper() -> None:
        while len(delivered) < 600 and not failures:
            await service.drain()

    await asyncio.wait_for(asyncio.gather(worker(), worker(), sweeper()), timeout=120)
    assert failures == []
    moved = [i for i in delivered if int(i) >= SPAN]
    assert moved, "no job was moved while the workers claimed"
    rows = await sql(
        runtime,
        "SELECT m.message_id, count(*) FROM job j JOIN message m ON m.pk = j.message_pk"
        " WHERE j.status = 'DELIVERED' GROUP BY 1",
    )
    assert len(rows) == 600 and all(n == 1 for _, n in rows)
    assert await sql(runtime, "SELECT count(*) FROM job WHERE status <> 'DELIVERED'") == [(0,)]
    await counts_match_rows(runtime)


# -- the message table -------------------------------------------------------------------------


async def message_leaves(rt: Runtime) -> list[str]:
    rows = await sql(
        rt,
        "SELECT relid::regclass::text FROM pg_partition_tree('message') WHERE isleaf ORDER BY 1",
    )
    return [r[0] for r in rows]


async def test_message_partitions_rotate_with_the_job_partitions_and_ids_stay_unique(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(client)
    service = retention(runtime)
    assert await message_leaves(runtime) == ["message_p0"]
    await service.maintain()
    assert await message_leaves(runtime) == ["message_p0", "message_p1"]  # ahead, empty
    await publish(client, "before", message_id="order-1")
    await both_intervals_over(runtime)
    report = RoundReport()
    await service.maintain(report)
    assert (report.rotated_to, report.messages_rotated_to) == ("job_p1", "message_p1")
    assert await message_leaves(runtime) == ["message_p0", "message_p1", "message_p2"]
    await publish(client, "after", message_id="order-2")
    rows = await sql(
        runtime,
        "SELECT message_id, pk, tableoid::regclass::text FROM message ORDER BY pk",
    )
    assert [(r[0], r[2]) for r in rows] == [("order-1", "message_p0"), ("order-2", "message_p1")]
    assert rows[0][1] < SPAN <= rows[1][1]
    # The id of a message in the closed partition is still taken: the duplicate check spans
    # every partition.
    r = await client.post(
        "/channel/c1/broadcast",
        content=b"again",
        headers=producer_headers(**{"X-Broker-Message-ID": "order-1"}),
    )
    assert r.status_code == 409, r.text
    assert await sql(runtime, "SELECT count(*) FROM message") == [(2,)]
    # Reads by id find either; the stream's sequences are the pks, over both partitions.
    for message_id in ("order-1", "order-2"):
        r = await client.get(f"/channel/c1/message/{message_id}")
        assert r.status_code == 200 and r.json()["ID"] == message_id, r.text
    async with runtime.db.transaction() as tx:
        stream = await BridgeStore(tx).stream_state("c1")
    assert stream is not None
    assert (stream.messages, stream.first_seq, stream.last_seq) == (2, rows[0][1], rows[1][1])
    # Jobs of both, delivered by id from their own partitions.
    jobs = await pull_jobs(client, k1, batch=2)
    assert sorted(j["Message"]["MessageID"] for j in jobs) == ["order-1", "order-2"]


async def archived(rt: Runtime, low: int, high: int) -> None:
    """What the batch archive does to messages no job refers to any more: deleted, with their
    keys."""
    await sql(rt, "DELETE FROM message WHERE pk >= :low AND pk < :high", low=low, high=high)
    await sql(
        rt,
        "DELETE FROM message_key WHERE message_pk >= :low AND message_pk < :high",
        low=low,
        high=high,
    )


async def test_a_message_partition_goes_once_archived_and_no_job_points_into_it(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(client)
    for i in range(3):
        await publish(client, f"x{i}", message_id=f"old-{i}")
    for j in await pull_jobs(client, k1, batch=3):
        r = await set_state(client, k1, j["ID"], {"NextState": "DELIVERED"})
        assert r.status_code == 202, r.text
    metrics = Metrics()
    service = RetentionService(
        runtime.db, 3600, 0, hold_seconds=HOLD, observe_states=metrics.partitions_counted
    )
    await service.maintain()
    await both_intervals_over(runtime)
    await service.maintain()
    # Closed and past the retention, but its messages are kept and their jobs point at them.
    report = await service.run_round()
    assert report.dropped == [] and await message_state(runtime, "message_p0") == "ATTACHED"
    # The job partition goes first (exported, dropped); the messages, no job left on them,
    # are archived; then the message partition goes.
    assert await service.store.mark_exported("job_p0", 3)
    assert (await service.finish_exported()).dropped == ["job_p0"]
    assert await service.message_store.state_counts() == {
        "ATTACHED": 3,
        "EXPORTED": 0,
        "DETACHED": 0,
        "DROPPED": 0,
    }
    await archived(runtime, 0, SPAN)
    report = await service.run_round()
    assert report.dropped == ["message_p0"]
    assert await message_leaves(runtime) == ["message_p1", "message_p2"]
    assert await message_state(runtime, "message_p0") == "DROPPED"
    exposed = metrics.render().decode()
    assert 'webhook_broker_partitions{state="DROPPED",table="message"} 1.0' in exposed
    assert 'webhook_broker_partitions{state="ATTACHED",table="message"} 2.0' in exposed
    assert 'webhook_broker_partitions{state="DROPPED",table="job"} 1.0' in exposed
    # The ids are free again, as an archived message's always were.
    await publish(client, "new", message_id="old-0")
    assert (await service.run_round()).dropped == []  # and once only


async def test_an_exported_message_partition_waits_for_the_jobs_pointing_into_it(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    # Marked exported with its messages in it (as an export of whole message partitions would
    # mark it): a job moved out of its old partition still points at one of them, so it stays
    # until that job is gone; then it is detached, its keys go, and it is dropped.
    (k1,) = await setup_channel(client)
    await publish(client, "kept", message_id="dead-one")
    service = retention(runtime)
    await service.maintain()
    await both_intervals_over(runtime)
    await service.maintain()
    await sql(runtime, "UPDATE job SET status = 'DEAD'")
    await service.drain()
    (job_id,) = (await sql(runtime, "SELECT id FROM job"))[0]
    assert job_id >= SPAN  # moved forward; its message stays where it is
    await sql(
        runtime,
        "UPDATE message_partition SET status = 'EXPORTED', exported_rows = 1"
        " WHERE name = 'message_p0'",
    )
    assert (await service.finish_messages()).detached == []
    assert await message_state(runtime, "message_p0") == "EXPORTED"
    r = await client.get("/channel/c1/message/dead-one")
    assert r.status_code == 200, r.text
    await sql(runtime, "DELETE FROM job WHERE id = :id", id=job_id)
    report = await service.finish_messages()
    assert (report.detached, report.dropped) == (["message_p0"], ["message_p0"])
    assert await sql(runtime, "SELECT count(*) FROM message_key") == [(0,)]
    assert "message_p0" not in await message_leaves(runtime)


async def test_a_crash_between_the_message_detach_and_drop_is_finished_next_round(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    await setup_channel(client)
    service = retention(runtime)
    await service.maintain()
    await both_intervals_over(runtime)
    await service.maintain()
    assert await service.message_store.mark_emptied(
        (await service.message_store.partitions())[0], 0
    )
    await service.message_store.detach("message_p0")  # and the process dies here
    assert await message_state(runtime, "message_p0") == "DETACHED"
    report = await service.finish_messages()
    assert (report.detached, report.dropped) == ([], ["message_p0"])
    assert (await sql(runtime, "SELECT to_regclass('message_p0')"))[0][0] is None


async def exported_with_nothing_pointing_in(
    client: httpx.AsyncClient, runtime: Runtime
) -> tuple[RetentionService, int, PullConsumer]:
    """message_p0 closed and EXPORTED (as the export of whole partitions marks it), holding
    one message (id kept-1, its key in message_key) that no job points at any more; the
    consumer's pk, and the consumer."""
    (k1,) = await setup_channel(client)
    await publish(client, "kept", message_id="kept-1")
    service = retention(runtime)
    await service.maintain()
    await both_intervals_over(runtime)
    await service.maintain()
    await sql(runtime, "DELETE FROM job")
    await sql(
        runtime,
        "UPDATE message_partition SET status = 'EXPORTED', exported_rows = 1"
        " WHERE name = 'message_p0'",
    )
    return service, await consumer_pk(runtime, "k1"), k1


async def message_pending(rt: Runtime) -> bool:
    rows = await sql(
        rt,
        "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass('message_p0')",
    )
    return bool(rows and rows[0][0])


async def point_into_p0(rt: Runtime, consumer: int) -> None:
    """A job for message_p0's message, as a history copy whose statement still saw the
    partition commits one while it detaches (read from the partition itself: a newer
    statement's message no longer shows a partition pending detach)."""
    await sql(
        rt,
        "INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,"
        " earliest_next_attempt_at, status_changed_at, created_at)"
        " SELECT pk, :c, 'QUEUED', 0, 1, now(), now(), now() FROM message_p0",
        c=consumer,
    )
    assert await sql(rt, "SELECT count(*) FROM job") == [(1,)]


async def back_with_its_keys(client: httpx.AsyncClient, runtime: Runtime) -> None:
    """message_p0 attached again and EXPORTED, its key kept: its message readable and its id
    still taken."""
    assert await message_state(runtime, "message_p0") == "EXPORTED"
    assert "message_p0" in await message_leaves(runtime)
    assert not await message_pending(runtime)
    assert await sql(runtime, "SELECT count(*) FROM message_key") == [(1,)]
    r = await client.get("/channel/c1/message/kept-1")
    assert r.status_code == 200, r.text
    r = await client.post(
        "/channel/c1/broadcast",
        content=b"again",
        headers=producer_headers(**{"X-Broker-Message-ID": "kept-1"}),
    )
    assert r.status_code == 409, r.text


@pytest.mark.parametrize("crash", ["half_way", "before_the_mark"])
async def test_a_message_detach_a_crash_stopped_is_finished_though_a_job_points_in(
    client: httpx.AsyncClient, runtime: Runtime, config: Any, crash: str
) -> None:
    # The sweeper found nothing pointing into message_p0 and started its DETACH ...
    # CONCURRENTLY; a history copy committed a job for it meanwhile; the sweeper died half
    # way through the detach (pending) or after it, before its state said DETACHED. The next
    # round finishes the detach whatever points in now, and brings the partition back.
    service, consumer, k1 = await exported_with_nothing_pointing_in(client, runtime)
    url = config.database.connection_url
    detach = "ALTER TABLE message DETACH PARTITION message_p0 CONCURRENTLY"
    if crash == "half_way":
        async with (
            await psycopg.AsyncConnection.connect(url) as older,
            await psycopg.AsyncConnection.connect(url, autocommit=True) as detacher,
        ):
            await older.execute("SELECT count(*) FROM message")
            detaching = asyncio.create_task(detacher.execute(detach))
            await eventually(lambda: message_pending(runtime), timeout=10, what="pending")
            detacher.cancel()
            with pytest.raises(psycopg.errors.QueryCanceled):
                await detaching
            await older.rollback()
        assert await message_pending(runtime)
    else:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as detacher:
            await detacher.execute(detach)
        assert "message_p0" not in await message_leaves(runtime)
    await point_into_p0(runtime, consumer)
    assert await message_state(runtime, "message_p0") == "EXPORTED"
    report = await service.finish_messages()
    assert (report.detached, report.dropped) == (["message_p0"], [])
    await back_with_its_keys(client, runtime)
    (job_id,) = (await sql(runtime, "SELECT id FROM job"))[0]
    # Its job's claim finds the message.
    jobs = await pull_jobs(client, k1, batch=1)
    assert [j["Message"]["MessageID"] for j in jobs] == ["kept-1"]
    assert (await service.finish_messages()).detached == []  # waits for that job
    await sql(runtime, "DELETE FROM job WHERE id = :id", id=job_id)
    report = await service.finish_messages()
    assert (report.detached, report.dropped) == (["message_p0"], ["message_p0"])
    assert await sql(runtime, "SELECT count(*) FROM message_key") == [(0,)]


async def test_a_job_made_during_the_message_detach_brings_the_partition_back_with_its_keys(
    client: httpx.AsyncClient, runtime: Runtime, config: Any
) -> None:
    service, consumer, _ = await exported_with_nothing_pointing_in(client, runtime)
    # An older transaction keeps the sweeper's DETACH ... CONCURRENTLY waiting; a job for the
    # partition's message commits meanwhile (a history copy whose statement saw it attached).
    async with await psycopg.AsyncConnection.connect(config.database.connection_url) as older:
        await older.execute("SELECT count(*) FROM message")
        finishing = asyncio.create_task(service.finish_messages())
        await eventually(lambda: message_pending(runtime), timeout=10, what="the detach waiting")
        await point_into_p0(runtime, consumer)
        await older.rollback()
        report = await finishing
    # Detached, then attached again instead of dropped, with its key: a publish repeating
    # the message's id is refused while the message is back.
    assert (report.detached, report.dropped) == (["message_p0"], [])
    await back_with_its_keys(client, runtime)
    await sql(runtime, "DELETE FROM job")
    assert (await service.finish_messages()).dropped == ["message_p0"]
    assert await sql(runtime, "SELECT count(*) FROM message_key") == [(0,)]
    await publish(client, "new", message_id="kept-1")  # free again


def _spawn_sweeper(config_file: Path) -> subprocess.Popen[bytes]:
    with (config_file.parent / "sweeper.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "app", "--config", str(config_file), "sweeper"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=config_file.parent,
            env={**os.environ, "HOME": str(config_file.parent)},
        )


async def test_a_sweeper_process_serves_the_partition_states_on_its_metrics(
    rdbms: str, runtime: Runtime, tmp_path: Path
) -> None:
    # The real `sweeper` process: its first round makes the partitions ahead, and its
    # [metrics] listener serves the states it counted then.
    port = free_port()
    config_file = tmp_path / "sweeper.cfg"
    config_file.write_text(rdbms + f"[metrics]\nlistener=127.0.0.1:{port}\n")
    proc = _spawn_sweeper(config_file)
    wanted = [
        'webhook_broker_partitions{state="ATTACHED",table="job"} 2.0',
        'webhook_broker_partitions{state="ATTACHED",table="message"} 2.0',
        'webhook_broker_partitions{state="DROPPED",table="message"} 0.0',
    ]

    async def served() -> bool:
        async with httpx.AsyncClient() as scraper:
            try:
                text = (await scraper.get(f"http://127.0.0.1:{port}/metrics")).text
            except httpx.HTTPError:
                return False
        return all(line in text for line in wanted)

    try:
        await eventually(served, timeout=30, what="the sweeper's partition gauge")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
