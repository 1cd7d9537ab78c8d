"""A change to a push consumer takes effect on its very next delivery: a callback moved away
from (a compromised endpoint, say) receives nothing published after the move. On PostgreSQL
the dispatcher runs in another runtime than the API (its own signals and NOTIFY listener, as
another process would); on SQLite, in the API's process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx
import pytest

from app.api.app import create_app
from app.config import Config
from app.domain.models import Consumer
from app.runtime import Runtime
from app.services.push import PushJob, PushService
from tests.helpers.push import publish, setup_push
from tests.helpers.receiver import Receiver, running_receiver
from tests.helpers.waiting import eventually


@pytest.fixture
def extra_config() -> str:
    return (
        "[broker]\nmax-retry=2\nretry-backoff-delays-in-seconds=1\n"
        "rational-delay-in-seconds=1\nmax-workers=4\n"
        "[consumer-connection]\nconnection-timeout-in-seconds=2\n"
        "token-header-name=X-Hook-Token\n"
    )


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    with running_receiver() as first, running_receiver() as second:
        yield first, second


@asynccontextmanager
async def deployment(config: Config) -> AsyncIterator[httpx.AsyncClient]:
    """The API and a running dispatcher: two runtimes on PostgreSQL, one on SQLite (whose
    processes share no announcements)."""
    apart = config.database.dialect == "postgresql"
    api = Runtime(config, run_sweeper=True, run_dispatcher=not apart)
    await api.start()
    dispatcher = Runtime(config, run_dispatcher=True) if apart else None
    try:
        if dispatcher is not None:
            await dispatcher.start(seed=False)
        transport = httpx.ASGITransport(app=create_app(config, api))
        async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
            yield http
    finally:
        if dispatcher is not None:
            await dispatcher.stop()
        await api.stop()


async def delivered(http: httpx.AsyncClient, message_id: str) -> None:
    """Wait for the message's one job to be DELIVERED (read by the message: the consumer's
    token, which the job's own route asks for, changes in these tests)."""

    async def is_delivered() -> bool:
        r = await http.get(f"/channel/c1/message/{message_id}")
        assert r.status_code == 200, r.text
        [job] = r.json()["Jobs"]
        assert job["Status"] == "DELIVERED", job
        return True

    await eventually(is_delivered, 15, 0.02, what=f"{message_id} DELIVERED")


async def move(http: httpx.AsyncClient, url: str, token: str) -> None:
    path = "/channel/c1/consumer/k1"
    current = await http.get(path)
    assert current.status_code == 200, current.text
    r = await http.put(
        path,
        data={"token": token, "callbackUrl": url},
        headers={"If-Unmodified-Since": current.headers["Last-Modified"]},
    )
    assert r.status_code == 200, r.text


async def test_a_callback_change_takes_effect_on_the_next_delivery(
    config: Config, receivers: tuple[Receiver, Receiver]
) -> None:
    async with deployment(config) as http:
        await setup_push(http, receivers[0].url + "/hook")
        await publish(http, b"before", "m-0")
        await delivered(http, "m-0")
        # Back and forth: each move must hold for the very next message, whenever the
        # dispatcher last read its consumers.
        for n in range(1, 5):
            now, before = receivers[n % 2], receivers[(n + 1) % 2]
            token = f"kt-{n}"
            await move(http, now.url + "/hook", token)
            await publish(http, b"after", f"m-{n}")
            await delivered(http, f"m-{n}")
            assert now.by_message()[f"m-{n}"] == 1, n
            assert before.by_message()[f"m-{n}"] == 0, n
            [got] = [r for r in now.requests if r.headers["x-broker-message-id"] == f"m-{n}"]
            assert got.headers["x-hook-token"] == token


async def test_a_change_committed_while_a_claim_runs_reaches_the_jobs_it_claimed(
    config: Config, receivers: tuple[Receiver, Receiver]
) -> None:
    """The claim statement is the one place where a dispatcher holds consumer settings it
    read before: a change committed between its read and the claim's answer (here, made
    right after the claim statement, before the dispatcher looks at its jobs) still decides
    where those jobs go."""
    old, new = receivers
    rt = Runtime(config, run_dispatcher=True)
    transport = httpx.ASGITransport(app=create_app(config, rt))
    http = httpx.AsyncClient(transport=transport, base_url="http://broker.test")
    moved = asyncio.Event()

    class ChangedDuringClaim(PushService):
        async def claim(self, consumer: Consumer, limit: int) -> list[PushJob]:
            jobs = await super().claim(consumer, limit)
            if jobs and not moved.is_set():
                moved.set()
                await move(http, new.url + "/hook", "kt-new")
            return jobs

    rt.push = ChangedDuringClaim(
        rt.db, rt.queue, config.broker.retry_policy, config.default_ack_wait_seconds
    )
    await rt.start()
    try:
        await setup_push(http, old.url + "/hook")
        await publish(http, b"claimed before the move", "m-raced")
        await delivered(http, "m-raced")
        assert moved.is_set()
        assert old.by_message()["m-raced"] == 0
        assert new.by_message()["m-raced"] == 1
        assert new.requests[0].headers["x-hook-token"] == "kt-new"
    finally:
        await http.aclose()
        await rt.stop()
