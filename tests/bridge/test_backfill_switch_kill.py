"""A bridge process killed right after a history consumer's switch to live, with a publish
racing that switch and others publishing throughout: after a restart every message of the
channel has exactly one job for the consumer (none lost, none made twice) and its delivery
ledger balances. The make-up for racing publishes is recorded in the database at the switch
(app/store/backfill.py), so the bridge that comes next finishes it.

The racing publish is made to race on purpose: a trigger on `message` (installed in this
test's throwaway database only) holds the publish whose message id starts with `racer` on an
advisory lock the test holds, after its statement took its snapshot (the consumer not live
yet) and before it reaches the channel row's lock; the test lets it go once the bridge is
dead. Two paths: a short history, switched in the CONSUMER.CREATE request, and one longer
than a chunk, switched by the bridge's copier."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from sqlalchemy import text

from app.config import Config
from app.runtime import Runtime
from app.store.ledger import LedgerStore
from tests.bridge.conftest import publish_http, uncapped_only
from tests.helpers.natsproc import NatsServer
from tests.helpers.waiting import eventually

REPO_ROOT = str(Path(__file__).resolve().parents[2])
HOLD_KEY = 39_0017  # the advisory lock the racing publish waits for
# A publish whose message id starts with `racer` waits for the test's advisory lock, in the
# middle of its statement (a BEFORE trigger runs before the row is inserted, so before the
# foreign key check that takes the channel row's key share).
HOLD_RACER = (
    f"""CREATE FUNCTION hold_racer() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_advisory_xact_lock_shared({HOLD_KEY});
        RETURN NEW;
    END $$""",
    """CREATE TRIGGER hold_racer BEFORE INSERT ON message FOR EACH ROW
    WHEN (NEW.message_id LIKE 'racer%') EXECUTE FUNCTION hold_racer()""",
)
CONSUMER = "history"


class BridgeProcess:
    """`python -m app bridge` on the test's database and hub; killed and started again."""

    def __init__(self, root: Path, config: Config, hub: NatsServer) -> None:
        self.root = root
        self.cfg = root / "bridge.cfg"
        self.cfg.write_text(
            "[rdbms]\ndialect=postgresql\n"
            f"connection-url={config.database.connection_url}\n"
            "[log]\nlog-level=info\n"
            f"[nats]\nurl={hub.url}\nqueue-group=switch-kill\n"
        )
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        self.starts += 1
        log = (self.root / f"bridge-{self.starts}.log").open("wb")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app",
            "--config",
            str(self.cfg),
            "bridge",
            cwd=self.root,
            env={**os.environ, "PYTHONPATH": REPO_ROOT},
            stdout=log,
            stderr=log,
        )

    def log(self) -> str:
        return (self.root / f"bridge-{self.starts}.log").read_text(errors="replace")[-3000:]

    async def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()

    async def stop(self) -> int | None:
        if self.process is None or self.process.returncode is not None:
            return None
        self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), timeout=20)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            return -9


@pytest.fixture
async def bridge(config: Config, hub: NatsServer, tmp_path: Path) -> AsyncIterator[BridgeProcess]:
    process = BridgeProcess(tmp_path, config, hub)
    try:
        yield process
    finally:
        code = await process.stop()
        assert code in (None, 0), process.log()


async def api(nc: Client, subject: str, body: dict[str, object] | None = None) -> dict[str, object]:
    reply = await nc.request(f"$JS.API.{subject}", json.dumps(body or {}).encode(), timeout=10)
    answer: dict[str, object] = json.loads(reply.data)
    return answer


async def answering(nc: Client, bridge: BridgeProcess) -> None:
    async def answers() -> bool:
        assert bridge.process is not None and bridge.process.returncode is None, bridge.log()
        try:
            await nc.request("$JS.API.STREAM.INFO.orders", b"", timeout=1)
        except (NoRespondersError, NatsTimeoutError):
            return False
        return True

    await eventually(answers, 60, 0.1, what="the bridge answering STREAM.INFO")


async def scalar(runtime: Runtime, sql: str, **params: object) -> object:
    async with runtime.db.transaction() as tx:
        return (await tx.conn.execute(text(sql), params)).scalar_one_or_none()


async def job_counts(runtime: Runtime, consumer_pk: int) -> dict[str, int]:
    """Each message of channel `orders` and how many jobs the consumer has for it."""
    async with runtime.db.transaction() as tx:
        rows = await tx.conn.execute(
            text(
                "SELECT message.message_id, count(job.id) FROM message"
                " LEFT JOIN job ON job.message_pk = message.pk AND job.consumer_pk = :pk"
                " WHERE message.channel_id = 'orders' GROUP BY message.message_id"
            ),
            {"pk": consumer_pk},
        )
        return {str(name): int(count) for name, count in rows}


@uncapped_only
@pytest.mark.parametrize("history", [20, 700], ids=["in-create", "by-copier"])
async def test_a_bridge_killed_after_a_switch_leaves_no_racing_publish_without_its_job(
    history: int,
    bridge: BridgeProcess,
    hub: NatsServer,
    client: httpx.AsyncClient,
    runtime: Runtime,
) -> None:
    async with runtime.db.transaction() as tx:
        for statement in HOLD_RACER:
            await tx.conn.execute(text(statement))
    await publish_http(client, [f"h{n}" for n in range(history)])
    await bridge.start()
    nc = await nats.connect(hub.url)
    publishing = asyncio.Event()
    publishing.set()
    published = 0
    publishers: list[asyncio.Future[None]] = []

    numbers = itertools.count()

    async def publish_all_along() -> None:
        nonlocal published
        for n in numbers:
            if not publishing.is_set():
                return
            await publish_http(client, [f"live{n}"])
            published += 1

    try:
        await answering(nc, bridge)
        publishers += [asyncio.ensure_future(publish_all_along()) for _ in range(2)]
        async with runtime.db.transaction() as hold:
            await hold.conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": HOLD_KEY})
            racer = asyncio.ensure_future(publish_http(client, ["racer"]))

            async def racer_held() -> bool:
                waiting = await scalar(
                    runtime,
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'"
                    " AND datname = current_database() AND query LIKE '%INSERT INTO message%'",
                )
                return bool(waiting)

            await eventually(racer_held, 30, what="the racing publish held in its statement")
            created = await api(
                nc,
                f"CONSUMER.CREATE.orders.{CONSUMER}",
                {
                    "stream_name": "orders",
                    "config": {
                        "durable_name": CONSUMER,
                        "ack_policy": "explicit",
                        "deliver_policy": "all",
                        "filter_subject": "orders",
                    },
                },
            )
            assert "error" not in created, created
            found = await scalar(
                runtime, "SELECT pk FROM consumer WHERE consumer_id = :c", c=CONSUMER
            )
            pk = int(str(found))

            async def live() -> bool:
                copying = await scalar(
                    runtime, "SELECT backfill_next FROM consumer WHERE pk = :pk", pk=pk
                )
                return copying is None

            await eventually(live, 60, 0.01, what="the consumer switched to live")
            await bridge.kill()
        # The bridge is dead; the racing publish commits now, without a job for the consumer
        # (its snapshot saw the consumer copying; the switch could not copy it).
        await racer
        counts = await job_counts(runtime, pk)
        assert counts["racer"] == 0, counts
        before = published
        await eventually(lambda: published > before + 5, 30, what="publishes while no bridge")

        await bridge.start()
        await answering(nc, bridge)
        # Publishes go on past the restart, then stop.
        restarted = published
        await eventually(lambda: published > restarted + 5, 30, what="publishes after a restart")
        publishing.clear()
        await asyncio.gather(*publishers)

        async def every_message_once() -> dict[str, int]:
            counts = await job_counts(runtime, pk)
            wrong = {name: n for name, n in counts.items() if n != 1}
            assert not wrong, wrong
            return counts

        counts = await eventually(every_message_once, 60, 0.2, what="one job per message")
        assert len(counts) == history + 1 + published, len(counts)

        # The record of the switch is cleared once no racing publish can still commit, and
        # the make-up never made a second job for any message.
        async def cleared() -> bool:
            switched = await scalar(
                runtime, "SELECT switched_at FROM consumer WHERE pk = :pk", pk=pk
            )
            return switched is None

        await eventually(cleared, 60, 0.2, what="the switch's record cleared")
        assert await every_message_once() == counts
        async with runtime.db.transaction() as tx:
            [entry] = await LedgerStore(tx).entries(pk)
        assert entry.unaccounted == 0, entry
        assert entry.held == len(counts), entry
    finally:
        publishing.clear()
        for task in publishers:
            task.cancel()
        await asyncio.gather(*publishers, return_exceptions=True)
        await nc.close()
