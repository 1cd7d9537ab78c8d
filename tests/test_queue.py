"""The queue's statements (app/store/queue.py) run alone and inside a transaction with the same
outcome, on PostgreSQL and SQLite: one text, run two ways, never two copies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from app.domain.tokens import TokenDigest
from app.runtime import Runtime
from app.store.db import Tx
from app.store.queue import Claimed, Named, NewMessage, Published
from tests.helpers.pull import (
    CHANNEL,
    CHANNEL_TOKEN,
    PRODUCER,
    PRODUCER_TOKEN,
    consumer_pk,
    setup_channel,
)

Way = Callable[[Runtime, Callable[[Tx | None], Awaitable[Any]]], Awaitable[Any]]


async def alone(_rt: Runtime, step: Callable[[Tx | None], Awaitable[Any]]) -> Any:
    return await step(None)


async def in_transaction(rt: Runtime, step: Callable[[Tx | None], Awaitable[Any]]) -> Any:
    async with rt.db.transaction() as tx:
        return await step(tx)


# The queue's statements compare tokens as stored: keyed hashes under this key.
TOKEN_KEY = "queue-test-key"
STORED = TokenDigest(TOKEN_KEY.encode())


@pytest.fixture
def extra_config() -> str:
    return f"[http]\ntoken-hash-key={TOKEN_KEY}\n"


WAYS = {"alone": alone, "in_transaction": in_transaction}


async def publish(rt: Runtime, message_id: str, size: int = 10, priority: int = 0) -> Published:
    published = await rt.queue.publish(
        message(message_id, b"x" * size, priority, headers={"X-Trace": message_id})
    )
    assert published is not None
    return published


def message(
    message_id: str,
    payload: bytes = b"x",
    priority: int = 0,
    *,
    channel_token: str = CHANNEL_TOKEN,
    headers: dict[str, str] | None = None,
) -> NewMessage:
    return NewMessage(
        channel_id=CHANNEL,
        channel_token=STORED(channel_token),
        producer_id=PRODUCER,
        producer_token=STORED(PRODUCER_TOKEN),
        message_id=message_id,
        payload=payload,
        content_type="text/plain",
        priority=priority,
        headers=headers or {},
    )


def seen(claimed: Claimed) -> list[tuple[str, int, int]]:
    """What a claim handed out, named by message (job ids differ between consumers)."""
    return [(j.message_id, j.attempt, j.priority) for j in claimed.jobs]


async def scenario(
    rt: Runtime, consumer_pk: int, way: Way, max_ack_pending: int | None
) -> list[object]:
    """Claims of every kind and acks, each step run `way`; the observable outcomes in order."""
    named = Named(consumer_pk)
    outcomes: list[object] = []

    async def claim(limit: int, **kw: Any) -> Claimed:
        async def step(tx: Tx | None) -> Claimed:
            return await rt.queue.claim(
                named,
                limit=limit,
                default_ack_wait=30,
                max_ack_pending=max_ack_pending,
                tx=tx,
                **kw,
            )

        claimed: Claimed = await way(rt, step)
        outcomes.append((seen(claimed), claimed.pending, len(claimed.seqs)))
        return claimed

    async def ack(targets: list[tuple[int, int | None]]) -> set[int]:
        async def step(tx: Tx | None) -> set[int]:
            return await rt.queue.ack(named, targets, tx)

        acked: set[int] = await way(rt, step)
        return acked

    first = await claim(2)  # the two highest priorities
    second = await claim(3, max_bytes=25)  # a byte budget: the 10-byte jobs that fit (2)
    third = await claim(3, numbered=True)  # numbered, as the bridge claims
    await claim(5)  # nothing left
    ids = [j.id for j in first.jobs + second.jobs + third.jobs]
    attempts = [j.attempt for j in first.jobs + second.jobs + third.jobs]
    outcomes.append(len(await ack([(ids[0], attempts[0])])))  # one ack, fenced
    outcomes.append(len(await ack([(ids[0], attempts[0])])))  # again: nothing moves
    outcomes.append(len(await ack([(ids[1], attempts[1] + 1)])))  # a stale attempt
    outcomes.append(len(await ack(list(zip(ids[1:], [None] * len(ids[1:]), strict=True)))))
    return outcomes


@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "capped"])
async def test_each_statement_alone_and_in_a_transaction(
    client: httpx.AsyncClient, runtime: Runtime, capped: bool
) -> None:
    # Two consumers of one channel get the same jobs: one runs every step alone, the other
    # inside a transaction, and both must see the same.
    fields = {"maxAckPending": "100"} if capped else {}
    await setup_channel(client, *WAYS, **fields)
    for index, priority in enumerate([5, 5, 0, 0, 0, 0, 0]):
        size = 30 if index == 4 else 10  # the byte budget stops at the fifth job
        await publish(runtime, f"m{index}", size=size, priority=priority)
    cap = 100 if capped else None
    results = {
        name: await scenario(runtime, await consumer_pk(runtime, name), way, cap)
        for name, way in WAYS.items()
    }
    assert results["alone"] == results["in_transaction"]
    claims = results["alone"]
    assert claims[0] == ([("m0", 1, 5), ("m1", 1, 5)], 5, 0)
    assert claims[1] == ([("m2", 1, 0), ("m3", 1, 0)], 3, 0)
    assert claims[2] == ([("m4", 1, 0), ("m5", 1, 0), ("m6", 1, 0)], 0, 3)
    assert claims[3] == ([], 0, 0)
    assert claims[4:] == [1, 0, 0, 6]


async def test_uncapped_statement_leaves_capped_consumers_alone(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """Without its cap the claim does not touch a capped consumer: only a claim that counted
    the in-flight jobs (under the consumer row's lock on PostgreSQL) may lease its jobs."""
    await setup_channel(client, "k1", maxAckPending="1")
    await publish(runtime, "a")
    await publish(runtime, "b")
    named = Named(await consumer_pk(runtime, "k1"))
    assert (await runtime.queue.claim(named, limit=5, default_ack_wait=30)).jobs == []
    capped = await runtime.queue.claim(named, limit=5, default_ack_wait=30, max_ack_pending=1)
    assert seen(capped) == [("a", 1, 0)] and capped.pending == 1
    full = await runtime.queue.claim(named, limit=5, default_ack_wait=30, max_ack_pending=1)
    assert full.jobs == [] and full.pending == 1  # the cap is reached; one job is still due


async def test_publish_and_credentials(client: httpx.AsyncClient, runtime: Runtime) -> None:
    await setup_channel(client, "k1", "k2")
    published = await publish(runtime, "one")
    assert len(published.consumer_pks) == 2
    assert published.message.headers == {"X-Trace": "one"}
    again = await runtime.queue.publish(message("one"))
    assert again is None  # a repeated message id stores nothing
    wrong = await runtime.queue.publish(message("two", channel_token="not-the-token"))
    assert wrong is None
    by_credentials = Named.by_credentials(CHANNEL, STORED(CHANNEL_TOKEN), "k1", "k1-token")
    claimed = await runtime.queue.claim(by_credentials, limit=5, default_ack_wait=30)
    assert seen(claimed) == [("one", 1, 0)]
    wrong_token = Named.by_credentials(CHANNEL, STORED(CHANNEL_TOKEN), "k2", "k1-token")
    assert (await runtime.queue.claim(wrong_token, limit=5, default_ack_wait=30)).jobs == []
    job = claimed.jobs[0]
    assert await runtime.queue.ack(wrong_token, [(job.id, 1)]) == set()
    assert await runtime.queue.ack(by_credentials, [(job.id, 1)]) == {job.id}
