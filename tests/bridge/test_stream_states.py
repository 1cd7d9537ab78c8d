"""STREAM.INFO's state (a count over the channel's messages) is read at most once per channel
every second by a bridge: requests in between, and those arriving while it is read, share it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from app.bridge.api import StreamStates
from app.domain.models import StreamState
from tests.helpers.waiting import eventually


def state(messages: int) -> StreamState:
    now = datetime.now(UTC)
    return StreamState(
        created=now,
        messages=messages,
        bytes=messages,
        first_seq=1,
        last_seq=messages,
        first_at=now,
        last_at=now,
        consumers=0,
    )


async def test_one_read_per_channel_per_ttl_shared_by_concurrent_requests() -> None:
    reads: list[str] = []
    release = asyncio.Event()

    async def load(channel: str) -> StreamState | None:
        reads.append(channel)
        await release.wait()
        return state(len(reads)) if channel != "gone" else None

    states = StreamStates(load, ttl=0.2)
    waiting = [asyncio.ensure_future(states.get("orders")) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    answers = await asyncio.gather(*waiting)
    assert reads == ["orders"]
    assert {a.messages for a in answers if a is not None} == {1}
    assert (await states.get("orders")) == answers[0]  # within the ttl: no read
    assert await states.get("gone") is None
    assert reads == ["orders", "gone"]

    async def read_afresh() -> bool:
        return (await states.get("orders")) != answers[0]

    await eventually(read_afresh, what="a read once the ttl ran out")
    assert reads == ["orders", "gone", "orders"]
