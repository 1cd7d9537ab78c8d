"""The bridge's statements on both databases (the sequence and its SQLite stand-in, delivery
state, releasing a claim), the migration without drift, and the [nats] config section."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from alembic import command
from sqlalchemy import update

from app.bridge.acks import apply_acks
from app.config import ConfigError, NatsConfig, load_config_text
from app.domain.jobs import AckType, JobStatus
from app.domain.models import Consumer
from app.domain.pulls import AckItem, AckResult, ClaimBatch
from app.runtime import Runtime
from app.services.admin import ConsumerForm
from app.services.bridge import BridgeService
from app.services.publishing import Broadcast
from app.store.jobs import JobStore
from app.store.migrate import alembic_config
from app.store.schema import job
from tests.bridge.conftest import CAPS, seed, uncapped_only
from tests.conftest import fresh_database


@pytest.fixture(params=["sqlite", "postgresql"])
async def both(request: pytest.FixtureRequest, cap: str) -> AsyncIterator[Runtime]:
    """A seeded runtime on a fresh database of each kind, `workers` in variant `cap`."""
    if request.param == "postgresql":
        request.getfixturevalue("pg_template")
        rdbms = fresh_database("postgresql", request.getfixturevalue("pg_base_url"), None)
    else:
        rdbms = fresh_database("sqlite", None, request.getfixturevalue("sqlite_template"))
    runtime = Runtime(load_config_text(rdbms + seed(cap)))
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


async def publish(runtime: Runtime, count: int) -> None:
    for n in range(count):
        await runtime.publishing.publish(
            "orders",
            Broadcast(
                channel_token=runtime.tokens.digest("orders-token"),
                producer_id="shop",
                producer_token=runtime.tokens.digest("shop-token"),
                payload=f"p{n}".encode(),
                content_type="text/plain",
                priority=None,
                message_id=None,
                metadata_header_names=None,
                headers={},
            ),
        )


async def claim(rt: Runtime, consumer: Consumer, limit: int) -> ClaimBatch:
    """A numbered claim, as the scheduler makes one for a JetStream request."""
    return await rt.claims.claim(consumer, limit, numbered=True)


async def test_delivery_sequences_are_per_consumer_and_gapless(both: Runtime) -> None:
    """Each consumer numbers its deliveries 1, 2, 3 ... as JetStream does, whatever another
    consumer of the channel took; claims of one consumer side by side never share a number."""
    await both.admin.put_consumer(
        "orders", "other", ConsumerForm("other-token", None, None, "pull"), None
    )
    service = BridgeService(
        both.db, both.claims, both.acks, both.config.broker.retry_policy, both.pins
    )
    workers = (await service.lookup("orders", "workers")).consumer
    other = (await service.lookup("orders", "other")).consumer
    assert workers is not None and other is not None
    await publish(both, 3)
    first = await claim(both, workers, 2)
    assert [d.seq for d in first.deliveries] == [1, 2]
    assert first.last_seq == 2
    assert [d.seq for d in (await claim(both, other, 3)).deliveries] == [1, 2, 3]
    assert [d.seq for d in (await claim(both, workers, 5)).deliveries] == [3]
    await publish(both, 40)
    batches = await asyncio.gather(*(claim(both, workers, 5) for _ in range(8)))
    numbers = [d.seq for batch in batches for d in batch.deliveries]
    assert sorted(numbers) == list(range(4, 44))
    for batch in batches:  # each claim's numbers follow its queue order
        assert [d.seq for d in batch.deliveries] == sorted(d.seq for d in batch.deliveries)
    state = (await service.snapshot(workers)).state
    assert state.last_delivery_seq == 43


async def test_claim_release_and_state(both: Runtime, cap: str) -> None:
    service = BridgeService(
        both.db, both.claims, both.acks, both.config.broker.retry_policy, both.pins
    )
    consumer = (await service.lookup("orders", "workers")).consumer
    assert consumer is not None and consumer.max_ack_pending == CAPS[cap]
    await publish(both, 3)
    batch = await claim(both, consumer, 2)
    assert [d.job.id for d in batch.deliveries] == [1, 2]
    assert [d.seq for d in batch.deliveries] == [1, 2]
    assert [d.pending for d in batch.deliveries] == [2, 1]  # job 3 is still due
    assert batch.due == 1 and batch.last_seq == 2 and batch.last_stream_seq == 2
    # Give job 2 back: due again, its attempt returned, no retry counted.
    await both.claims.release(consumer.pk, [(2, 1)])
    await both.claims.release(consumer.pk, [(1, 7)])  # a stale attempt changes nothing
    async with both.db.transaction() as tx:
        jobs = JobStore(tx)
        one, two = await jobs.get(1), await jobs.get(2)
    assert one is not None and one.status is JobStatus.INFLIGHT
    assert two is not None and (two.status, two.attempt, two.retry_count) == (
        JobStatus.QUEUED,
        0,
        0,
    )
    result = await service.acks(consumer, [AckItem(1, AckType.ACK, attempt=1)])
    assert [o.result for o in result.outcomes] == [AckResult.DONE]
    snapshot = await service.snapshot(consumer)
    assert snapshot.state.last_delivery_seq == 2 and snapshot.state.last_stream_seq == 2
    assert snapshot.state.outstanding == 0  # job 2 was given back, job 1 acked
    assert snapshot.stats.due == 2
    later = await claim(both, consumer, 5)
    assert [(d.job.id, d.job.attempt, d.seq) for d in later.deliveries] == [(2, 1, 3), (3, 1, 4)]
    assert later.due == 0
    # A NAK that uses up the retries reports the job as dead.
    policy = both.config.broker.retry_policy
    for attempt in range(1, policy.max_retry + 2):
        if attempt > 1:
            async with both.db.transaction() as tx:  # make the nak'ed job due at once
                await tx.conn.execute(update(job).values(earliest_next_attempt_at=job.c.created_at))
            [again] = (await claim(both, consumer, 1)).deliveries
            assert again.job.id == 2
        result = await service.acks(consumer, [AckItem(2, AckType.NAK, attempt=attempt, delay=60)])
        assert [o.result for o in result.outcomes] == [AckResult.DONE]
    assert [j.id for j in result.dead] == [2]


@uncapped_only
async def test_migration_has_no_drift(both: Runtime) -> None:
    """`alembic check`: the schema module and the migrations (0002_bridge included) agree."""
    await asyncio.to_thread(command.check, alembic_config(both.config.database))


def test_nats_config_defaults_and_keys() -> None:
    base = "[rdbms]\ndialect=sqlite\nconnection-url=x.sqlite3\n"
    assert load_config_text(base).nats == NatsConfig()
    config = load_config_text(
        base + "[nats]\nmode=hybrid\nurl=nats://a:4222,nats://b:4222\nleaf-url=nats-leaf://a:7422\n"
        "api-prefix=BRIDGE.API\nqueue-group=g\nuser=u\npassword=p\nleaf-token=t\n"
    )
    assert config.nats.mode == "hybrid"
    assert config.nats.url == "nats://a:4222,nats://b:4222"
    assert (config.nats.api_prefix, config.nats.ack_prefix) == ("BRIDGE.API", "$WB.ACK")
    assert (config.nats.user, config.nats.password, config.nats.leaf_token) == ("u", "p", "t")
    env = load_config_text(base, environ={"WEBHOOK_BROKER__NATS__URL": "nats://env:4222"})
    assert env.nats.url == "nats://env:4222"


@pytest.mark.parametrize(
    ("section", "names"),
    [
        ("mode=push", "[nats] mode"),
        ("mode=hybrid", "[nats] leaf-url"),
        ("url=http://x:1", "[nats] url"),
        ("ack-prefix=$JS.ACK", "[nats] ack-prefix"),
        ("api-prefix=a.*.b", "[nats] api-prefix"),
        ("colour=blue", "[nats] colour"),
    ],
)
def test_bad_nats_config_names_the_key(section: str, names: str) -> None:
    base = "[rdbms]\ndialect=sqlite\nconnection-url=x.sqlite3\n"
    with pytest.raises(ConfigError) as caught:
        load_config_text(base + "[nats]\n" + section + "\n")
    assert names in str(caught.value)


@uncapped_only
async def test_an_ack_the_database_refuses_is_dropped_alone(both: Runtime) -> None:
    """A refused value (a NUL in a reason: PostgreSQL stores no NUL, SQLite does) costs only
    its own ack; the acks applied with it still apply (the bridge's ack queue once retried
    the whole batch forever)."""
    service = BridgeService(
        both.db, both.claims, both.acks, both.config.broker.retry_policy, both.pins
    )
    consumer = (await service.lookup("orders", "workers")).consumer
    assert consumer is not None
    await publish(both, 3)
    batch = await claim(both, consumer, 3)
    assert [d.job.id for d in batch.deliveries] == [1, 2, 3]
    items = [
        AckItem(1, AckType.ACK, attempt=1),
        AckItem(2, AckType.TERM, attempt=1, reason="bad\x00reason"),
        AckItem(3, AckType.NAK, attempt=1, delay=60),
    ]
    result = await apply_acks(service, consumer, items)
    refused = both.db.dialect == "postgresql"
    assert [o.result for o in result.outcomes] == [
        AckResult.DONE,
        AckResult.UNKNOWN_JOB if refused else AckResult.DONE,
        AckResult.DONE,
    ]
    async with both.db.transaction() as tx:
        jobs = JobStore(tx)
        statuses = [(await jobs.get(i)) for i in (1, 2, 3)]
    assert [j.status if j else None for j in statuses] == [
        JobStatus.DELIVERED,
        JobStatus.INFLIGHT if refused else JobStatus.DEAD,
        JobStatus.QUEUED,
    ]
