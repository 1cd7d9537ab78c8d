"""A consumer deleted while a publish runs (the chaos suite found it answering 500): the
publish's snapshot still names the consumer, the job's foreign key finds its row gone when
the deletion commits. The publish runs again and stores the message for the consumers left."""

from __future__ import annotations

import asyncio

import httpx
import psycopg
import pytest

from app.config import Config
from app.runtime import Runtime
from tests.helpers.pull import consumer_pk, job_rows, publish, setup_channel
from tests.helpers.waiting import eventually


@pytest.fixture
def backend() -> str:
    return "postgresql"


async def test_a_publish_racing_a_consumer_deletion_stores_the_rest(
    client: httpx.AsyncClient, runtime: Runtime, config: Config
) -> None:
    await setup_channel(client, "k1", "k2")
    doomed = await consumer_pk(runtime, "k2")
    url = config.database.connection_url
    with psycopg.connect(url) as deleter:
        # The deletion holds the consumer's row: the publish's foreign key check waits for it.
        deleter.execute("DELETE FROM consumer WHERE pk = %s", (doomed,))
        published = asyncio.create_task(publish(client, "raced", message_id="m-race"))

        def blocked() -> bool:
            with psycopg.connect(url) as watcher:
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()
            return row is not None and row[0] >= 1

        # The publish's statement waits on the deleter's row lock, seen from the server.
        await eventually(lambda: asyncio.to_thread(blocked), what="the publish waiting on a lock")
        assert not published.done()
        deleter.commit()
        assert await asyncio.wait_for(published, 10) == "m-race"
    assert [row.consumer_id for row in await job_rows(runtime)] == ["k1"]
