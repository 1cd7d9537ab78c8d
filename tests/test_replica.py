"""Reads from a replica ([rdbms] replica-url, issue 42) against a real streaming replica: a
second throwaway cluster made by pg_basebackup from a primary of this module's own (so that
pausing its replay or stopping it touches no other test's database).

What is shown: reads served by the replica with the right data and X-Broker-Read-From saying
so; a replica whose lag passes [rdbms] replica-max-lag (replay paused) or that is stopped sends
reads to the primary (the header saying so, the warning logged once per change, not per read);
writes never reach it (its own pg_stat_statements sees reads only); the console's pages and
/job-status read from it; SQLite and no replica-url read the primary."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Iterator

import httpx
import psycopg
import pytest

from app.api.app import create_app
from app.config import Config, load_config_text
from app.domain.console import JobFilter
from app.domain.replica import (
    ReadFrom,
    ReplicaHealth,
    ReplicaState,
    WalSample,
    choose,
    lag_from_samples,
    state_of,
)
from app.runtime import Runtime
from app.services.reads import Reads
from tests.helpers.pull import CHANNEL, CHANNEL_TOKEN, publish, pull_jobs, setup_channel
from tests.helpers.replica import Pair, fresh_database, primary_with_replica, rdbms_section
from tests.helpers.waiting import eventually

MAX_LAG = 2.0


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    def statements(conn: psycopg.Connection) -> None:
        # Copied into each test's database and replicated: the replica's own counts.
        conn.execute("CREATE EXTENSION pg_stat_statements")

    with primary_with_replica("wb_replica_template", statements=True, prepare=statements) as pair:
        yield pair


@pytest.fixture
def backend() -> str:
    return "postgresql"


@pytest.fixture
def database(pair: Pair) -> Iterator[str]:
    with fresh_database(pair, "wb_replica") as name:
        yield name


@pytest.fixture
def rdbms(pair: Pair, database: str) -> str:
    return rdbms_section(pair.primary.url(database), pair.replica.url(database), MAX_LAG)


@pytest.fixture
def config(rdbms: str) -> Config:
    return load_config_text(rdbms)


@pytest.fixture
async def runtime(config: Config) -> AsyncIterator[Runtime]:
    rt = Runtime(config)
    await rt.start()
    try:
        yield rt
    finally:
        await rt.stop()


@pytest.fixture
async def client(config: Config, runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(config, runtime))
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
        yield http


def replica_sql(pair: Pair, database: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(pair.replica.url(database), autocommit=True) as conn:
        return conn.execute(sql).fetchall()


async def on_replica(rt: Runtime) -> None:
    await eventually(lambda: rt.reads.source() is ReadFrom.REPLICA, what="reads on the replica")


async def served_by_replica(client: httpx.AsyncClient, path: str) -> httpx.Response:
    """The answer once the replica has replayed what it shows (a miss there is the primary's)."""

    async def get() -> httpx.Response | None:
        r = await client.get(path)
        assert r.status_code == 200, r.text
        return r if r.headers["X-Broker-Read-From"] == "replica" else None

    found = await eventually(get, what=f"{path} answered by the replica")
    assert found is not None
    return found


# -- the policy --------------------------------------------------------------------------------


def test_the_lag_is_the_age_of_the_newest_primary_position_the_replica_has_replayed() -> None:
    samples = [WalSample(10.0, 100), WalSample(11.0, 200), WalSample(12.0, 300)]
    assert lag_from_samples(samples, 300) == (0.0, 0.0)
    assert lag_from_samples(samples, 250) == (1.0, 1.0)
    assert lag_from_samples(samples, 100) == (2.0, 2.0)
    # Behind every sample kept: not known, at least as old as the samples.
    assert lag_from_samples(samples, 50) == (None, 2.0)
    # An idle primary: its position stands still, so a replica at it is current however old
    # the last transaction is.
    idle = [WalSample(float(t), 500) for t in range(10)]
    assert lag_from_samples(idle, 500) == (0.0, 0.0)


def test_the_measurement_age_counts_as_lag() -> None:
    health = ReplicaHealth(up=True, lag=0.5, measured_at=100.0)
    assert state_of(health, 2.0, 101.0) is ReplicaState.SERVING
    assert state_of(health, 2.0, 101.6) is ReplicaState.LAGGING
    assert choose(health, 2.0, 101.0) is ReadFrom.REPLICA
    assert choose(health, 2.0, 103.0) is ReadFrom.PRIMARY
    assert choose(None, 2.0, 101.0) is ReadFrom.PRIMARY
    unknown = ReplicaHealth(up=True, lag=None, measured_at=100.0)
    assert choose(unknown, 2.0, 100.0) is ReadFrom.PRIMARY
    down = ReplicaHealth(up=False, lag=None, measured_at=100.0)
    assert state_of(down, 2.0, 100.0) is ReplicaState.DOWN


def test_sqlite_or_no_replica_url_reads_the_primary() -> None:
    sqlite = load_config_text("[rdbms]\nreplica-url=postgresql://x@127.0.0.1:1/db\n")
    assert sqlite.database.replica is None
    none = load_config_text("[rdbms]\ndialect=postgresql\nconnection-url=postgresql://x@h/db\n")
    assert none.database.replica is None
    assert none.database.replica_max_lag_seconds == 5.0
    with pytest.raises(ValueError, match="replica-url"):
        load_config_text(
            "[rdbms]\ndialect=postgresql\nconnection-url=postgresql://x@h/db\n"
            "replica-url=mysql://x@h/db\n"
        )
    with pytest.raises(ValueError, match="replica-max-lag"):
        load_config_text("[rdbms]\nreplica-max-lag=0s\n")
    assert load_config_text(
        "[rdbms]\nreplica-max-lag=250ms\n"
    ).database.replica_max_lag_seconds == (0.25)


# -- against the replica -----------------------------------------------------------------------


async def test_reads_are_served_by_the_replica_with_the_primarys_data(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(client, "k1")
    message_id = await publish(client, "from the primary", message_id="m-1")
    await on_replica(runtime)

    r = await served_by_replica(client, f"/channel/{CHANNEL}/message/{message_id}")
    assert r.json()["Payload"] == "from the primary"

    async def counted() -> httpx.Response | None:
        r = await client.get("/job-status")
        entries = r.json().get(CHANNEL, {}).get("k1", [])
        queued = [e["count"] for e in entries if e["status"] == "QUEUED"]
        return r if r.headers["X-Broker-Read-From"] == "replica" and queued == [1] else None

    await eventually(counted, what="/job-status from the replica counting the job")
    listed = {
        "/channels": None,
        "/producers": None,
        "/dlq-status": None,
        f"/channel/{CHANNEL}/consumers": None,
        f"/channel/{CHANNEL}/messages": None,
        f"/channel/{CHANNEL}/scheduled-messages": None,
        f"/channel/{CHANNEL}/messages-status": None,
    }
    for path in listed:
        r = await client.get(path)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["X-Broker-Read-From"] == "replica", path
    r = await client.get(f"/channel/{CHANNEL}/messages")
    assert r.json()["Result"] == [f"/channel/{CHANNEL}/message/{message_id}"]
    r = await client.get(f"{k1.base}/queued-jobs", headers=k1.auth)
    assert r.headers["X-Broker-Read-From"] == "replica"
    assert [j["Message"]["Payload"] for j in r.json()["Result"]] == ["from the primary"]
    r = await client.get(f"{k1.base}/dlq", headers=k1.auth)
    assert (r.status_code, r.headers["X-Broker-Read-From"]) == (200, "replica")

    metrics = (await client.get("/metrics")).text
    assert 'webhook_broker_reads_total{source="replica"}' in metrics
    lag = [line for line in metrics.splitlines() if line.startswith("webhook_broker_replica_lag")]
    assert lag and float(lag[0].split()[1]) <= MAX_LAG


async def test_a_replica_read_that_lags_past_the_limit_falls_back_to_the_primary(
    client: httpx.AsyncClient,
    runtime: Runtime,
    pair: Pair,
    database: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await setup_channel(client, "k1")
    first = await publish(client, "one", message_id="first")
    await on_replica(runtime)
    await served_by_replica(client, f"/channel/{CHANNEL}/message/{first}")
    caplog.set_level(logging.INFO, logger="app.services.reads")
    caplog.clear()  # from here on (the first checks may find the new database not replayed yet)

    replica_sql(pair, database, "SELECT pg_wal_replay_pause()")
    try:
        second = await publish(client, "two", message_id="second")
        listed_path = f"/channel/{CHANNEL}/messages"
        reads = 0

        async def on_primary() -> bool:
            nonlocal reads
            r = await client.get(listed_path)
            reads += 1
            listed = {u.rsplit("/", 1)[1] for u in r.json()["Result"]}
            # Whoever answers, the header tells which: the paused replica has not the second.
            if r.headers["X-Broker-Read-From"] == "replica":
                assert listed == {first}
                return False
            assert listed == {first, second}
            return True

        await eventually(on_primary, timeout=30, what="the lagging replica left for the primary")
        r = await client.get(f"/channel/{CHANNEL}/message/{second}")
        assert (r.status_code, r.headers["X-Broker-Read-From"]) == (200, "primary")
        r = await client.get("/job-status")
        assert r.headers["X-Broker-Read-From"] == "primary"
        await eventually(lambda: runtime.metrics.replica_lag._value.get() > MAX_LAG)
        for _ in range(5):  # more reads: no more warnings
            assert (await client.get(listed_path)).headers["X-Broker-Read-From"] == "primary"
        warnings = [r for r in caplog.records if "replica-max-lag" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert warnings[0].levelno == logging.WARNING
    finally:
        replica_sql(pair, database, "SELECT pg_wal_replay_resume()")

    r = await served_by_replica(client, f"/channel/{CHANNEL}/message/{second}")
    assert r.json()["Payload"] == "two"
    back = [r for r in caplog.records if "reads go to the replica" in r.getMessage()]
    assert len(back) == 1


async def test_a_stopped_replica_sends_reads_to_the_primary(
    client: httpx.AsyncClient,
    runtime: Runtime,
    pair: Pair,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await setup_channel(client, "k1")
    message_id = await publish(client, "kept", message_id="kept")
    await on_replica(runtime)
    await served_by_replica(client, f"/channel/{CHANNEL}/message/{message_id}")
    caplog.set_level(logging.INFO, logger="app.services.reads")
    caplog.clear()  # from here on (the first checks may find the new database not replayed yet)

    pair.replica.down()
    try:
        # The read that finds it gone is answered by the primary, not failed.
        for _ in range(5):
            r = await client.get(f"/channel/{CHANNEL}/message/{message_id}")
            assert r.status_code == 200, r.text
            assert r.headers["X-Broker-Read-From"] == "primary"
            assert r.json()["Payload"] == "kept"
        r = await client.get("/job-status")
        assert (r.status_code, r.headers["X-Broker-Read-From"]) == (200, "primary")
        await eventually(lambda: math.isnan(runtime.metrics.replica_lag._value.get()))
        downs = [r for r in caplog.records if "reads go to the primary" in r.getMessage()]
        assert len(downs) == 1, [r.getMessage() for r in downs]
    finally:
        pair.replica.up()
        pair.replica.wait_streaming()

    await served_by_replica(client, f"/channel/{CHANNEL}/message/{message_id}")


async def test_writes_never_go_to_the_replica(
    client: httpx.AsyncClient, runtime: Runtime, pair: Pair, database: str
) -> None:
    (k1,) = await setup_channel(client, "k1")
    await on_replica(runtime)
    # Every kind of change, while reads are on the replica (which would refuse any write: a
    # hot standby is read-only, so a misrouted one would fail here).
    for n in range(3):
        await publish(client, f"m{n}", message_id=f"m{n}")
    jobs = await pull_jobs(client, k1, batch=3)
    acks = [{"id": jobs[0]["ID"], "type": "ack"}, {"id": jobs[1]["ID"], "type": "term"}]
    r = await client.post(f"{k1.base}/ack", json={"acks": acks}, headers=k1.auth)
    assert r.status_code == 200, r.text
    r = await client.post(f"{k1.base}/dlq", headers=k1.auth)
    assert r.status_code == 202, r.text
    r = await client.get(f"/channel/{CHANNEL}")
    r = await client.put(
        f"/channel/{CHANNEL}",
        data={"token": CHANNEL_TOKEN, "name": "renamed"},
        headers={"If-Unmodified-Since": r.headers["Last-Modified"]},
    )
    assert r.status_code == 200, r.text
    await served_by_replica(client, f"/channel/{CHANNEL}/message/m2")
    await served_by_replica(client, "/job-status")

    statements = replica_sql(
        pair,
        database,
        "SELECT query FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    texts = [str(row[0]).lstrip().upper() for row in statements]
    assert any("JOB_COUNT" in t for t in texts), texts  # the replica served reads
    written = [
        t
        for t in texts
        if t.startswith(("INSERT", "UPDATE", "DELETE", "WITH")) or "FOR UPDATE" in t
    ]
    assert not written, written


async def test_the_console_and_job_status_read_from_the_replica(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(client, "k1")
    message_id = await publish(client, "seen in the console", message_id="c-1")
    await on_replica(runtime)
    await served_by_replica(client, f"/channel/{CHANNEL}/message/{message_id}")

    note = Reads.begin_request()
    overview = await runtime.console.overview()
    assert note.source is ReadFrom.REPLICA
    assert [(row.consumer_id, row.queued) for row in overview.consumers] == [("k1", 1)]
    note = Reads.begin_request()
    page = await runtime.console.search(CHANNEL, k1.id, JobFilter(status=None), None)
    assert note.source is ReadFrom.REPLICA
    (row,) = page.jobs
    note = Reads.begin_request()
    found = await runtime.console.job(CHANNEL, k1.id, row.job.id)
    assert note.source is ReadFrom.REPLICA
    assert found.message.payload == b"seen in the console"

    note = Reads.begin_request()
    counts = await runtime.job_status.by_consumer()
    assert note.source is ReadFrom.REPLICA
    assert counts


def test_the_replica_reads_declare_their_header(config: Config) -> None:
    document = create_app(config).openapi()
    routes = {
        ("/job-status", "get"),
        ("/dlq-status", "get"),
        ("/channels", "get"),
        ("/producers", "get"),
        ("/channel/{channel_id}/consumers", "get"),
        ("/channel/{channel_id}/messages", "get"),
        ("/channel/{channel_id}/scheduled-messages", "get"),
        ("/channel/{channel_id}/messages-status", "get"),
        ("/channel/{channel_id}/message/{message_id}", "get"),
        ("/channel/{channel_id}/scheduled-message/{message_id}", "get"),
        ("/channel/{channel_id}/consumer/{consumer_id}/queued-jobs", "get"),
        ("/channel/{channel_id}/consumer/{consumer_id}/dlq", "get"),
    }
    for path, method in routes:
        answer = document["paths"][path][method]["responses"]["200"]
        assert "X-Broker-Read-From" in answer["headers"], path
    header = document["components"]["headers"]["X-Broker-Read-From"]
    assert header["schema"]["enum"] == ["replica", "primary"]
    # Changes answer without it: they never read from the replica.
    for path, method, status in (
        ("/channel/{channel_id}/broadcast", "post", "201"),
        ("/channel/{channel_id}", "put", "200"),
        ("/channel/{channel_id}", "get", "200"),
    ):
        answer = document["paths"][path][method]["responses"][status]
        assert "X-Broker-Read-From" not in answer.get("headers", {}), path
