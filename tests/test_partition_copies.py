"""The NATS bridge's history copy (app/store/backfill.py) and the mark of a message partition
exported whole (app/pipeline/partitions.py) on PostgreSQL: a copy makes jobs only for messages
of an ATTACHED message partition, and the two serialise on the partition's state row. A copy in
flight delays the mark, which then sees its jobs and is refused; a copy after the mark, or one
that waited for it, makes no job for the partition's messages and still copies the others."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httpx
import psycopg
import pytest

from app.pipeline.db import connect
from app.pipeline.partitions import _LOCK_MESSAGES, _MARK_MESSAGES, MessagePartitionArchiver
from app.runtime import Runtime
from app.store.backfill import BackfillStore
from app.store.partitions import MIN_ID, SPAN
from tests.helpers.message_partitions import both_intervals_over, message_state, retention, sql
from tests.helpers.pull import consumer_pk, publish, setup_channel
from tests.helpers.waiting import eventually

PIPELINE = "wb-pipeline"  # app/pipeline/db.connect's application_name
MARK = {"rows": 2, "name": "message_p0", "low": MIN_ID, "high": SPAN}


@pytest.fixture
def backend() -> str:
    return "postgresql"  # SQLite has no message partitions


async def old_and_new(client: httpx.AsyncClient, runtime: Runtime) -> int:
    """Two messages in message_p0, closed and with no job pointing into it, one in message_p1;
    a consumer copying its history from the start: its pk."""
    await setup_channel(client)
    for i in range(2):
        await publish(client, f"old{i}", message_id=f"old-{i}")
    service = retention(runtime)
    await service.maintain()
    await both_intervals_over(runtime)
    await service.maintain()
    await publish(client, "new", message_id="new-0")
    await sql(runtime, "DELETE FROM job")
    pk = await consumer_pk(runtime, "k1")
    await sql(runtime, "UPDATE consumer SET backfill_next = 0 WHERE pk = :pk", pk=pk)
    return pk


def mark(url: str) -> bool:
    """The pipeline's mark of message_p0 as exported whole, on its own connection."""
    with connect(url) as conn:
        nothing = cast(Any, None)  # the mark uses the connection only
        archiver = MessagePartitionArchiver(nothing, nothing, nothing, conn, nothing)
        return archiver._mark("message_p0", MIN_ID, SPAN, 2)


async def waiting_for_a_lock(rt: Runtime, pipeline: bool) -> bool:
    rows = await sql(
        rt,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database() AND (application_name = :app) = :pipeline",
        app=PIPELINE,
        pipeline=pipeline,
    )
    return bool(rows[0][0])


async def copied_messages(rt: Runtime) -> list[str]:
    rows = await sql(
        rt,
        "SELECT m.message_id FROM job j JOIN message m ON m.pk = j.message_pk ORDER BY 1",
    )
    return [r[0] for r in rows]


async def test_a_copy_in_flight_delays_the_mark_which_then_sees_its_jobs(
    client: httpx.AsyncClient, runtime: Runtime, config: Any
) -> None:
    pk = await old_and_new(client, runtime)
    url = config.database.connection_url
    async with runtime.db.transaction() as tx:
        copied = await BackfillStore(tx).copy(pk, 0, 100)
        assert copied is not None and copied[0] == 3
        marking = asyncio.create_task(asyncio.to_thread(mark, url))
        await eventually(
            lambda: marking.done() or waiting_for_a_lock(runtime, True),
            timeout=10,
            what="the mark waiting for the copy",
        )
        assert not marking.done()  # it waits for the copy's commit
    assert not await marking  # and then finds the copy's jobs
    assert await message_state(runtime, "message_p0") == "ATTACHED"
    assert await copied_messages(runtime) == ["new-0", "old-0", "old-1"]


async def test_a_copy_after_the_mark_makes_no_job_into_the_partition(
    client: httpx.AsyncClient, runtime: Runtime, config: Any
) -> None:
    pk = await old_and_new(client, runtime)
    assert await asyncio.to_thread(mark, config.database.connection_url)
    async with runtime.db.transaction() as tx:
        copied = await BackfillStore(tx).copy(pk, 0, 100)
    assert copied is not None and copied[0] == 1
    assert await copied_messages(runtime) == ["new-0"]
    # Past every message: the partition's are not copied later either.
    assert await sql(runtime, "SELECT max(pk) < :at FROM message", at=copied[1]) == [(True,)]
    assert await message_state(runtime, "message_p0") == "EXPORTED"


async def test_a_copy_waiting_for_the_mark_makes_no_job_into_the_partition(
    client: httpx.AsyncClient, runtime: Runtime, config: Any
) -> None:
    pk = await old_and_new(client, runtime)
    with psycopg.connect(config.database.connection_url, application_name=PIPELINE) as marker:
        with marker.transaction():
            marker.execute(_LOCK_MESSAGES, MARK)
            assert marker.execute(_MARK_MESSAGES, MARK).rowcount == 1

            async def copy() -> tuple[int, int] | None:
                async with runtime.db.transaction() as tx:
                    return await BackfillStore(tx).copy(pk, 0, 100)

            copying = asyncio.create_task(copy())
            await eventually(
                lambda: copying.done() or waiting_for_a_lock(runtime, False),
                timeout=10,
                what="the copy waiting for the mark",
            )
            assert not copying.done()
        # The mark committed: the copy reads the row again and finds it EXPORTED.
        copied = await copying
    assert copied is not None and copied[0] == 1
    assert await copied_messages(runtime) == ["new-0"]
