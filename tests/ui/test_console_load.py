"""The console's load check (issue 38): 20 open console pages on a broker delivering at full
speed cost the database fewer than 5 statements a second in all.

A live broker process (`serve`) on PostgreSQL, a producer publishing and a worker pulling and
acking as fast as they can (the client library), and 20 open overview pages. The pages are
plain HTTP clients holding the overview's event stream (`GET /ui/events`) open with a
signed-in session cookie (devtools/console_pages.py, which the bench's pull-console scenario opens
too): a browser tab costs the server that same stream, since the table it draws comes in the
events, so no browser is needed to load the broker as 20 tabs would.

The statements are counted by PostgreSQL itself (pg_stat_statements), over a window measured by
events: from one update to the 20 pages until each has received WINDOW_UPDATES more. The
module starts a throwaway cluster of its own (devtools/pg.py with pg_stat_statements loaded;
the suite's shared cluster runs without it). The console's statements are its two reads (the
overview and the ledger, told apart by their texts) and the BEGIN and COMMIT of the
transaction each update runs in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import event
from webhook_broker_client import Broker, BrokerError

from app.runtime import Runtime
from app.store.ledger import LedgerStore
from bench.__main__ import SCENARIOS, parse_args
from bench.report import console_target
from devtools.console_pages import (
    DEALLOC_SQL,
    STATEMENTS_SQL,
    ConsolePages,
    console_cost,
    console_statement,
)
from devtools.tasks import Background
from tests.helpers.processes import BrokerProcess
from tests.helpers.statements import counted_database
from tests.helpers.waiting import eventually

ADMIN = "load-admin-token"
CHANNEL, CONSUMER, PRODUCER = "orders", "billing", "shop"
TOKENS = {"channel": "orders-token", "consumer": "billing-token", "producer": "shop-token"}
PAGES = 20
WINDOW_UPDATES = 8  # updates every page receives inside the measured window
LIMIT_PER_SECOND = 5.0
PUBLISH_BATCH = 50


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    """A migrated database on a cluster that loads pg_stat_statements; its [rdbms] section."""
    with counted_database("console_load") as (_cluster, url):
        yield url


@pytest.fixture(scope="module")
def broker(database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config: Path = tmp_path_factory.mktemp("console-load") / "broker.cfg"
    config.write_text(
        f"[rdbms]\ndialect=postgresql\nconnection-url={database}\n"
        f"[http]\nadmin-token={ADMIN}\n[log]\nlog-level=warning\n"
    )
    process = BrokerProcess(config)
    process.start()
    auth = {"Authorization": f"Bearer {ADMIN}"}
    try:
        with httpx.Client(base_url=process.url, headers=auth) as http:
            r = http.put(f"/producer/{PRODUCER}", data={"token": TOKENS["producer"]})
            assert r.status_code == 200, r.text
            r = http.put(f"/channel/{CHANNEL}", data={"token": TOKENS["channel"]})
            assert r.status_code == 200, r.text
            form = {"token": TOKENS["consumer"], "type": "pull"}
            r = http.put(f"/channel/{CHANNEL}/consumer/{CONSUMER}", data=form)
            assert r.status_code == 200, r.text
        yield process.url
    finally:
        process.stop()


class Load(Background):
    """A producer publishing and a worker pulling and acking, each as fast as it can."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.client = Broker(
            url,
            producer_id=PRODUCER,
            producer_token=TOKENS["producer"],
            channel_tokens={CHANNEL: TOKENS["channel"]},
        )
        self.published = 0
        self.acked = 0

    async def open(self) -> None:
        self.start(self._publish(), self._work())

    async def close(self) -> None:
        errors = await self.stop()
        await self.client.aclose()
        if errors:
            raise errors[0]

    def check(self) -> None:
        """Fail with the producer's or the worker's error, if either stopped on one."""
        failure = self.failure()
        if failure is not None:
            raise AssertionError("the load stopped") from failure

    async def _publish(self) -> None:
        n = 0
        while True:
            payloads: list[Any] = [{"order": n + i} for i in range(PUBLISH_BATCH)]
            results = await self.client.publish_many(CHANNEL, payloads, connections=4)
            failed = [r for r in results if isinstance(r, BrokerError)]
            if failed:
                raise failed[0]
            n += PUBLISH_BATCH
            self.published = n

    async def _work(self) -> None:
        worker = self.client.consumer(CHANNEL, CONSUMER, consumer_token=TOKENS["consumer"])
        while True:
            jobs = await worker.fetch(100, expires=1)
            # Acked together: the client sends them as one batch ack.
            await asyncio.gather(*(job.ack() for job in jobs))
            self.acked += len(jobs)


async def _statements(db: psycopg.AsyncConnection[Any]) -> dict[int, tuple[str, int]]:
    rows = await (await db.execute(STATEMENTS_SQL)).fetchall()
    return {int(queryid): (str(query), int(calls)) for queryid, query, calls in rows}


async def _evictions(db: psycopg.AsyncConnection[Any]) -> int:
    row = await (await db.execute(DEALLOC_SQL)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.timeout(600)
async def test_twenty_open_pages_cost_the_database_fewer_than_5_statements_a_second(
    broker: str, database: str
) -> None:
    async with (
        await psycopg.AsyncConnection.connect(database, autocommit=True) as db,
        Load(broker) as load,
        ConsolePages([broker], PAGES, ADMIN) as pages,
    ):
        # Delivering before the window opens, and the pages' updates flowing.
        def delivering() -> bool:
            load.check()
            return load.acked >= 5 * PUBLISH_BATCH

        await eventually(delivering, 60, what="the worker acking the producer's jobs")
        await pages.updates(1, within=60)

        acked_before = load.acked
        evicted = await _evictions(db)
        before = await _statements(db)
        started = time.monotonic()
        await pages.updates(WINDOW_UPDATES, within=120)
        after = await _statements(db)
        seconds = time.monotonic() - started
        evicted = await _evictions(db) - evicted
        load.check()
        acked = load.acked - acked_before

    cost = console_cost(before, after, seconds)
    everything = sum(calls - before.get(q, (text, 0))[1] for q, (text, calls) in after.items())
    seen = (
        f"{cost.overview_reads} overview and {cost.ledger_reads} ledger reads in {seconds:.1f} s"
        f" for {PAGES} pages ({cost.per_second:.2f} console statements/s, BEGIN/COMMIT"
        f" included); the database ran {everything / seconds:,.0f} statements/s in all while"
        f" {acked / seconds:,.0f} jobs/s were acked"
    )
    assert evicted == 0, f"pg_stat_statements evicted entries {evicted} times in the window"
    assert acked > 0, seen  # delivering inside the window, not only before it
    # One read per update for every open page together, never one per page: the window's
    # WINDOW_UPDATES updates (one read may fall on either side of its edges).
    assert WINDOW_UPDATES - 1 <= cost.overview_reads <= WINDOW_UPDATES + 2, seen
    assert abs(cost.ledger_reads - cost.overview_reads) <= 1, seen
    assert cost.per_second < LIMIT_PER_SECOND, seen


@pytest.fixture
def backend() -> str:
    return "sqlite"


async def test_the_console_reads_are_told_apart_from_the_brokers_by_their_texts(
    runtime: Runtime,
) -> None:
    """The texts the load check and the bench count by, as the store sends them (fast: SQLite,
    in-process): an overview is its two reads, and the ledger read filtered by consumer (the
    ledger settle's) is not the console's."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    engine = runtime.db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        await runtime.console.overview()
        overview = list(sent)
        sent.clear()
        async with runtime.db.transaction() as tx:
            await LedgerStore(tx).entries(1)
        await runtime.job_status.by_consumer()
        others = list(sent)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert sorted(filter(None, map(console_statement, overview))) == ["ledger", "overview"]
    assert [console_statement(text) for text in others if console_statement(text)] == []

    read = {console_statement(text): text for text in overview}
    before = {1: (read["overview"], 10), 3: ("SELECT 1", 5)}
    after = {1: (read["overview"], 14), 2: (read["ledger"], 4), 3: ("SELECT 1", 900)}
    cost = console_cost(before, after, 2.0)
    assert (cost.overview_reads + cost.ledger_reads, cost.statements) == (8, 16)
    assert cost.per_second == 8.0


def test_the_bench_checks_the_console_against_its_round_to_round_spread() -> None:
    """The bench's pull-console scenario (not run here: the bench is never run by the tests):
    selectable by name, and its verdict from the rounds' pairs."""
    assert "pull-console" in SCENARIOS
    assert parse_args(["--only", "pull-console"]).wants("pull-console")

    def pairs(*rounds: tuple[float, float]) -> list[dict[str, float]]:
        return [
            {"ceiling": a, "ours": b, "ratio": b / a, "console_statements_per_s": 2.5}
            for a, b in rounds
        ]

    # Plain runs 1000, 1100, 950: spread 150 / 1000 = 15%.
    within = console_target(pairs((1000, 950), (1100, 1000), (950, 900)))
    assert within.verdict == "PASS" and "spread 15.0%" in within.measured
    assert "2.5 statements/s" in within.measured
    beyond = console_target(pairs((1000, 700), (1100, 800), (950, 700)))
    assert beyond.verdict == "FAIL"
    assert console_target(pairs((1000, 990))).verdict == "n/a"  # one round: no spread
