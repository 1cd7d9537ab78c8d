"""NOTIFY payloads stay under PostgreSQL's 8000-byte limit however many consumers a channel has."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import psycopg
import pytest
from sqlalchemy import insert

from app.config import Config
from app.runtime import Runtime
from app.store.db import MAX_NOTIFY_PAYLOAD, NOTIFY_CHANNEL, _payload
from app.store.schema import consumer
from tests.helpers.pull import CHANNEL, job_rows, publish, setup_channel


def test_small_sets_name_each_consumer() -> None:
    assert _payload({3, 1, 2}) == "1,2,3"


def test_huge_sets_wake_everyone() -> None:
    payload = _payload(set(range(1, 5000)))
    assert payload == "*"
    assert len(_payload(set(range(1, 1000)))) <= MAX_NOTIFY_PAYLOAD


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_one_statement_publish_to_a_huge_channel_wakes_everyone(
    client: httpx.AsyncClient, runtime: Runtime, config: Config
) -> None:
    """The publish statement builds its NOTIFY payload in SQL: past the limit it sends "*"."""
    await setup_channel(client, "k1")
    async with runtime.db.transaction() as tx:
        await tx.conn.execute(
            insert(consumer),
            [
                {
                    "channel_id": CHANNEL,
                    "consumer_id": f"many{n}",
                    "name": f"many{n}",
                    "token": "t",
                    "type": "pull",
                    "created_at": datetime.now(UTC),
                    "updated_at": datetime.now(UTC),
                }
                for n in range(2500)
            ],
        )
    url = config.database.sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as listener:
        await listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        await publish(client, "to everyone")
        payloads = []
        async for note in listener.notifies(timeout=2.0):
            payloads.append(note.payload)
    assert payloads == ["*"]
    assert len(await job_rows(runtime)) == 2501
