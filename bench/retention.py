"""Issue 42's `retention` scenario: jobs published, delivered and archived in cycles, with the
archive dropping whole job partitions (`retention`) and, beside it in the same run, today's row
deletes (`retention-delete`).

Each variant has a database and a broker of its own (`webhook-broker api` x api-procs and one
`webhook-broker sweeper`, on the run's PostgreSQL cluster), one pull consumer on one channel, and
the variants' cycles alternate, so both see the same machine. A cycle:

1. fill: a block of jobs, written by the publish statement's set-based form (message rows by
   generate_series with their keys in message_key, one QUEUED job each, the ledger's
   published count), then ANALYZE;
2. deliver the block: HTTP pull(batch) + batch ack by `pollers` clients in a process of their
   own (`python -m bench.retention deliver`), until the block is delivered;
3. once a quarter of the block is delivered (`LEAD`), archive the previous block, while the
   deliveries go on, as an operator of a small box runs it: `python -m app.pipeline archive`,
   a process of its own (Spark local mode, a JVM per run) at [pipeline] niceness 19, its
   exports reading a streaming replica of the run's cluster (devtools/replica.py, started
   under `nice -n 19`, made once for the run and shared by both variants) once it has
   replayed past the primary; `partitions` exports the closed job partition and, first, the
   message partition whose jobs left with the job partition the cycle before (no job points
   into it any more), and marks them; the sweeper's own round (RetentionService.run_round,
   its interval not over) detaches both CONCURRENTLY and drops them (the message partition's
   keys leave message_key first). One archive run a cycle, no row deleted: a block's messages
   leave a cycle after its jobs, so the message table holds two blocks where the job table
   holds one;
   `deletes` runs the same archive with partition-interval off, which exports the block in
   batches of the default batch-size (100,000) and deletes their rows, as today;
4. `partitions`: the block's partition closes (RetentionService.maintain, the sweeper's rotation,
   run with its interval taken as over: a cycle stands for one partition-interval);
5. the job and message tables' total size (every partition) and the job table's dead tuples.

Claim (pull) latency is the client's, per request; throughput is counted from the database
(`status_changed_at` of the block's jobs inside each window, the client's wall clock being the
database's on this host). A cycle's window runs from the moment every client has had its first
answer to the answer that left fewer jobs than pollers x batch to pull (from then on the block
runs dry); the archive's time inside it is "while the archive runs", the rest "outside". The
targets pool every cycle: jobs/s while archiving >= 90% of outside, pull p50 and p99 <= 1.10x,
and the job table after the last cycle <= 1.10x its size after the second (the first cycle
archives nothing, so the table holds one block then and its working size only from the second).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import psycopg

from bench import db
from bench.broker import PRODUCER, Broker, token
from bench.env import REPO, Measured, Settings
from bench.http1 import Connection, HttpError
from bench.loadgen import emit, percentiles

NAMES = {"partitions": "retention", "deletes": "retention-delete"}  # variant -> scenario
LABELS = {"partitions": "partitions dropped", "deletes": "row deletes (today)"}
DEFAULT_JOBS = 20_000_000  # the issue's
DEFAULT_CYCLE = 1_000_000
CHANNEL = "ret"
CONSUMER = "ret"
LEAD = 0.25  # share of a block delivered before the previous block's archive starts
FILL_CHUNK = 100_000  # messages per fill statement
ARCHIVE_BATCH = 100_000  # [pipeline] batch-size's default: today's archive deletes this many
RATIO_BOUND = 0.10  # the issue: within 10% while the archive runs
ARCHIVE_NICENESS = 19  # the archive and its replica take only CPU the claims leave idle
# The replica serves only the archive here: its replay waits for an export's reads rather than
# cancelling them (a cancelled export is redone on the primary), and it sends no feedback that
# would hold back the primary's vacuum of the jobs the claims walk.
REPLICA_SETTINGS = {"hot_standby_feedback": "off", "max_standby_streaming_delay": "-1"}
# A replica at nice 19 replays behind a busy primary: waiting costs the claims nothing.
REPLICA_WAIT = "10m"
# The pipeline processes' JVMs: no web UI (each run would take a port), no progress bars.
SPARK_SUBMIT_ARGS = (
    "--conf spark.ui.enabled=false --conf spark.ui.showConsoleProgress=false pyspark-shell"
)
FLAT_BOUND = 1.10  # last cycle's job table / the first archived cycle's
EXPIRES = 1.0  # a pull's long-poll wait
EMPTY_STOP = 3  # empty pulls in a row after which a client gives up on a dry block
NAME_PREFIX = "retention ("
OUTSIDE, DURING = "outside the archive", "while the archive runs"

FILL = """
WITH allowed AS (
    SELECT id, generation FROM channel WHERE id = %(channel)s
), stored AS (
    INSERT INTO message (channel_id, message_id, producer_id, payload, content_type, priority,
                         headers, received_at)
    SELECT allowed.id, %(prefix)s || g, %(producer)s, convert_to(%(payload)s, 'UTF8'),
           'application/json', 0, '{}'::json, now()
    FROM allowed, generate_series(1, %(n)s) AS g
    RETURNING pk, channel_id, message_id, received_at
), keyed AS (
    -- The publish's duplicate check: the keys leave again with their messages (the row
    -- archive's delete) or their partition (the sweeper's, before the detach).
    INSERT INTO message_key (channel_id, message_id, message_pk)
    SELECT channel_id, message_id, pk FROM stored
), fanned AS (
    INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,
                     earliest_next_attempt_at, status_changed_at, created_at)
    SELECT stored.pk, consumer.pk, 'QUEUED', 0, %(size)s, stored.received_at,
           stored.received_at, stored.received_at
    FROM stored JOIN consumer ON consumer.channel_id = %(channel)s
        AND consumer.backfill_next IS NULL
    RETURNING id
), counted AS (
    INSERT INTO published_count (channel_id, generation, shard, n)
    SELECT allowed.id, allowed.generation, 0, (SELECT count(*) FROM stored) FROM allowed
    ON CONFLICT (channel_id, generation, shard) DO UPDATE SET n = published_count.n + excluded.n
)
SELECT count(*), min(id), max(id) FROM fanned
"""

SIZES = """
SELECT (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree('job')),
       (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)
          FROM pg_partition_tree('message')),
       (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
         WHERE relid IN (SELECT relid FROM pg_partition_tree('job'))),
       (SELECT count(*) FROM pg_partition_tree('job') WHERE isleaf)
"""

COUNT_WINDOWS = """
SELECT {columns} FROM job
WHERE id BETWEEN %(low)s AND %(high)s AND consumer_pk = %(consumer)s AND status = 'DELIVERED'
"""


@dataclass
class Plan:
    jobs: int = DEFAULT_JOBS
    cycle: int = DEFAULT_CYCLE
    variants: tuple[str, ...] = ("partitions", "deletes")
    pollers: int = 4
    batch: int = 100
    api_procs: int = 2
    spark_master: str | None = None  # [pipeline] master's default: local[*]
    # How the archive runs: this nice value (the pipeline process and its JVM), reading a
    # streaming replica started at the same nice value (False: the primary).
    archive_niceness: int = ARCHIVE_NICENESS
    replica: bool = True
    keep_databases: bool = False
    # A control run: no archive, a wait this long in its place (the windows split as before).
    control: float = 0.0

    def blocks(self) -> list[int]:
        cycles = max(1, math.ceil(self.jobs / max(1, self.cycle)))
        base, extra = divmod(self.jobs, cycles)
        return [base + (1 if i < extra else 0) for i in range(cycles)]


def asked(s: Settings) -> bool:
    """Hours at the issue's size: only when named in --only, or sized with --retention-jobs."""
    named = any(name in s.only for name in NAMES.values())
    return named or (s.retention_jobs > 0 and bool(chosen(s)))


def chosen(s: Settings) -> tuple[str, ...]:
    return tuple(v for v, name in NAMES.items() if s.wants(name))


def plan_for(s: Settings) -> Plan:
    return Plan(
        jobs=s.retention_jobs or DEFAULT_JOBS,
        cycle=s.retention_cycle,
        variants=chosen(s),
        pollers=s.pollers,
        batch=s.batch,
        api_procs=s.api_procs,
        control=s.retention_control,
    )


# -- the broker of one variant ---------------------------------------------------------------------


def archive_batches(block: int) -> tuple[int, int]:
    """(batch-size, max-batches) for a run that archives one block: batches of at most the
    default size, as many as hold the block (the oldest messages go first, so they are the
    previous block's; what rounding adds, fewer messages than batches, comes from the block
    being delivered)."""
    count = max(1, math.ceil(block / ARCHIVE_BATCH))
    return max(1, math.ceil(block / count)), count


def config_text(
    url: str,
    root: Path,
    *,
    partitions: bool,
    batches: tuple[int, int] = (1, 1),
    replica_url: str = "",
    niceness: int = 0,
) -> str:
    """The broker's config, which the pipeline process reads too. partition-interval 1d: the
    sweeper never rotates in the middle of a cycle (the bench ends each interval); retention 0
    days: a closed partition or a finished batch is archived at once; batches that take the
    previous block and nothing of the one being delivered (archive_batches)."""
    return "\n".join(
        [
            "[rdbms]",
            "dialect=postgresql",
            f"connection-url={url}",
            *([f"replica-url={replica_url}"] if replica_url else []),
            f"partition-interval={'1d' if partitions else 'off'}",
            "[log]",
            "log-level=warning",
            "[broker]",
            "max-workers=200",
            "[pipeline]",
            f"archive-root={root / 'archive'}",
            f"report-root={root / 'report'}",
            "retention-days=0",
            f"batch-size={batches[0]}",
            f"max-batches={batches[1]}",
            f"niceness={niceness}",
            f"replica-wait={REPLICA_WAIT}",
            "[initial-channels]",
            f"{CHANNEL}={CHANNEL}",
            "[initial-channel-tokens]",
            f"{CHANNEL}={token(CHANNEL)}",
            "[initial-producers]",
            f"{PRODUCER}={PRODUCER}",
            "[initial-producer-tokens]",
            f"{PRODUCER}={token(PRODUCER)}",
            "[initial-consumers]",
            f"{CONSUMER}=",
            f"[{CONSUMER}]",
            f"token={token(CONSUMER)}",
            f"channel={CHANNEL}",
            "type=pull",
        ]
    )


@dataclass
class VariantBroker(Broker):
    text: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.config.write_text(self.text)


@dataclass
class Phase:
    jobs: int = 0
    seconds: float = 0.0
    pulls: list[float] = field(default_factory=list)
    acks: list[float] = field(default_factory=list)

    def add(self, other: Phase) -> None:
        self.jobs += other.jobs
        self.seconds += other.seconds
        self.pulls += other.pulls
        self.acks += other.acks

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "seconds": round(self.seconds, 3),
            "jobs_per_s": round(self.rate, 1),
            "pull_ms": percentiles(self.pulls),
            "ack_ms": percentiles(self.acks),
        }


@dataclass
class Variant:
    name: str
    base_url: str
    root: Path
    plan: Plan
    dbname: str = ""
    broker: VariantBroker | None = None
    conn: psycopg.AsyncConnection[Any] | None = None
    consumer_pk: int = 0
    cycles: list[dict[str, Any]] = field(default_factory=list)
    outside: Phase = field(default_factory=Phase)
    during: Phase = field(default_factory=Phase)
    previous: tuple[int, int, int] | None = None  # (jobs, low id, high id) of the last block
    database: Any = None  # app.store.db.Database, for the partition steps
    replica_base: str = ""  # the run's replica (its postgres database), if any

    @property
    def partitions(self) -> bool:
        return self.name == "partitions"

    @property
    def url(self) -> str:
        head, _, _ = self.base_url.rpartition("/")
        return f"{head}/{self.dbname}"

    @property
    def replica_url(self) -> str:
        if not self.replica_base:
            return ""
        head, _, _ = self.replica_base.rpartition("/")
        return f"{head}/{self.dbname}"

    def text(self, batches: tuple[int, int] | None = None) -> str:
        """The broker's config; with `batches`, the archive's (which alone has the replica:
        the brokers would only measure its lag)."""
        return config_text(
            self.url,
            self.root,
            partitions=self.partitions,
            batches=batches or (1, 1),
            replica_url=self.replica_url if batches else "",
            niceness=self.plan.archive_niceness,
        )

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.dbname = f"retention_{self.name}_{int(time.time() * 1000) % 10**9}"
        async with await db.connect(self.base_url) as conn:
            await conn.execute(f"CREATE DATABASE {self.dbname}")
        # No [nats] section: these brokers run no bridge and publish no advisories.
        self.broker = VariantBroker(
            self.root, self.url, 0, "", self.plan.api_procs, text=self.text()
        )
        await asyncio.to_thread(self.broker.migrate)
        await self.broker.start()
        self.conn = await db.connect(self.url)
        self.consumer_pk = (await db.consumer_pks(self.conn))[CONSUMER]
        if self.partitions:
            from app.config import load_config_text
            from app.store.db import Database

            self.database = Database.from_config(load_config_text(self.text()).database)

    async def stop(self) -> None:
        if self.database is not None:
            await self.database.dispose()
        if self.conn is not None:
            await self.conn.close()
        if self.broker is not None:
            await self.broker.stop()
        if self.dbname and not self.plan.keep_databases:
            with contextlib.suppress(psycopg.Error):
                async with await db.connect(self.base_url) as conn:
                    await conn.execute(f"DROP DATABASE IF EXISTS {self.dbname} WITH (FORCE)")

    @property
    def sql(self) -> psycopg.AsyncConnection[Any]:
        assert self.conn is not None
        return self.conn

    # -- the steps of a cycle ----------------------------------------------------------------------

    async def fill(self, count: int) -> tuple[int, int]:
        """`count` QUEUED jobs; their lowest and highest ids."""
        low: int | None = None
        high: int | None = None
        prefix = f"r{len(self.cycles)}-{int(time.time())}-"
        for start in range(0, count, FILL_CHUNK):
            n = min(FILL_CHUNK, count - start)
            row = await (
                await self.sql.execute(
                    FILL,
                    {
                        "channel": CHANNEL,
                        "prefix": f"{prefix}{start}-",
                        "producer": PRODUCER,
                        "payload": db.payload(),
                        "size": db.PAYLOAD_BYTES,
                        "n": n,
                    },
                )
            ).fetchone()
            assert row is not None and row[0] == n, f"fill made {row} of {n} jobs"
            low = int(row[1]) if low is None else min(low, int(row[1]))
            high = int(row[2]) if high is None else max(high, int(row[2]))
        # A bulk insert is ahead of autovacuum's analyze, as a steady publish flow never is.
        await self.sql.execute("ANALYZE job")
        await self.sql.execute("ANALYZE message")
        assert low is not None and high is not None
        return low, high

    async def archive(self, log: TextIO) -> dict[str, Any]:
        """The previous block's archive; what each step did and took."""
        assert self.previous is not None
        config = self.root / "pipeline.cfg"
        await asyncio.to_thread(config.write_text, self.text(archive_batches(self.previous[0])))
        steps: dict[str, Any] = {}

        async def pipeline(step: str) -> dict[str, Any]:
            started = time.monotonic()
            summary = await run_pipeline(config, self.plan.spark_master, log)
            steps[step] = {
                "seconds": round(time.monotonic() - started, 3),
                "niceness": summary.get("niceness"),
            }
            if summary.get("status") != "ok":
                raise RuntimeError(f"pipeline archive ({self.name}): {summary.get('error')}")
            read_from = Counter(summary.get("partitions", {}).get("read_from", {}))
            read_from.update(summary.get("message_partitions", {}).get("read_from", {}))
            read_from.update(summary.get("archive", {}).get("read_from", {}))
            steps[step]["read_from"] = dict(read_from)
            return summary

        async def sweeper_round(step: str, before: list[str]) -> None:
            # The variant's own broker sweeper runs the same round on its period and may take
            # the step first, as soon as the archive has marked: what was dropped is read from
            # the partitions' state (`before`: taken ahead of the archive), whoever did it.
            started = time.monotonic()
            report = await self.retention().run_round()
            after = await self.kept_partitions()
            steps[step] = {
                "seconds": round(time.monotonic() - started, 3),
                "detached": report.detached,
                "dropped": [n for n in before if n not in after],
            }

        kept = await self.kept_partitions() if self.partitions else []
        first = await pipeline("archive")
        if self.partitions:
            steps["archive"]["exported"] = first.get("partitions", {}).get("exported", [])
            # The message partition whose jobs left with the previous cycle's job partition,
            # exported whole by the same run (the one before it still has this block's jobs
            # pointing into it: it goes next cycle).
            whole = first.get("message_partitions", {})
            steps["archive"]["messages_exported"] = whole.get("exported", [])
            steps["archive"]["messages"] = whole.get("messages", 0)
            # The sweeper's round (its interval not over: no rotation) detaches and drops the
            # job partition, then forgets the message partition's keys, detaches and drops it.
            await sweeper_round("detach+drop", kept)
        else:
            steps["archive"]["archived_jobs"] = first.get("archive", {}).get("archived_jobs", 0)
        # The bench keeps no archive: 20M jobs of Parquet would only fill the disk.
        await asyncio.to_thread(shutil.rmtree, self.root / "archive", True)
        return steps

    async def kept_partitions(self) -> list[str]:
        """The job partitions and then the message partitions not dropped yet, each in key
        order."""
        from app.store.partitions import JOBS, MESSAGES, PartitionStore

        names: list[str] = []
        for of in (JOBS, MESSAGES):
            names += [p.name for p in await PartitionStore(self.database, of).partitions()]
        return names

    def retention(self, interval: float = 86400.0) -> Any:
        """The broker's retention service on this variant's database (its config: 1d, 0 days)."""
        from app.services.retention import RetentionService

        return RetentionService(self.database, interval, 0, hold_seconds=120.0)

    async def rotate(self) -> str:
        """The block's partition closes: the sweeper's rotation, with the interval over."""
        from sqlalchemy.exc import DBAPIError

        from app.services.retention import RoundReport

        for _ in range(5):
            report = RoundReport()
            # Making the next partition ahead gives up past its lock timeout: again.
            with contextlib.suppress(DBAPIError):
                await self.retention(interval=1e-6).maintain(report)
            if report.rotated_to is not None:
                return report.rotated_to
            await asyncio.sleep(0.5)
        raise RuntimeError(f"{self.dbname}: the job partition did not rotate")

    async def sizes(self) -> dict[str, int]:
        row = await (await self.sql.execute(SIZES)).fetchone()
        assert row is not None
        return {
            "job_bytes": int(row[0]),
            "message_bytes": int(row[1]),
            "job_dead_tuples": int(row[2]),
            "job_partitions": int(row[3]),
        }

    async def count_windows(
        self, low: int, high: int, windows: Sequence[tuple[float, float]]
    ) -> list[int]:
        """Jobs of the block delivered in each (wall-clock) window, from the database."""
        if not windows:
            return []
        columns = ", ".join(
            f"count(*) FILTER (WHERE status_changed_at >= %(s{i})s"
            f" AND status_changed_at < %(e{i})s)"
            for i in range(len(windows))
        )
        params: dict[str, Any] = {"low": low, "high": high, "consumer": self.consumer_pk}
        for i, (start, end) in enumerate(windows):
            params[f"s{i}"], params[f"e{i}"] = at(start), at(end)
        row = await (
            await self.sql.execute(COUNT_WINDOWS.format(columns=columns), params)
        ).fetchone()
        assert row is not None
        return [int(x) for x in row]

    async def undelivered(self, low: int, high: int) -> int:
        return int(
            await db.scalar(
                self.sql,
                "SELECT count(*) FROM job WHERE id BETWEEN %s AND %s AND status <> 'DELIVERED'",
                (low, high),
            )
        )


async def run_pipeline(config: Path, master: str | None, log: TextIO) -> dict[str, Any]:
    """`python -m app.pipeline archive` as its own process, as an operator's timer runs it;
    its JSON summary (its progress and Spark's go to `log`)."""
    log.flush()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app.pipeline",
        "archive",
        "--config",
        str(config),
        *(["--master", master] if master else []),
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
        cwd=REPO,
        env={**os.environ, "PYSPARK_SUBMIT_ARGS": SPARK_SUBMIT_ARGS},
        # A session of its own, as cron or a service manager gives it: under scheduler
        # autogroups its niceness then yields to the broker (app/priority.py). In the bench's
        # session it slowed the bench's own delivery client instead.
        start_new_session=True,
    )
    out, _ = await proc.communicate()
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"pipeline archive exited {proc.returncode} without a summary")
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary


def at(wall: float) -> datetime:
    return datetime.fromtimestamp(wall, UTC)


# -- one cycle -------------------------------------------------------------------------------------


@dataclass
class Windows:
    span: tuple[float, float] | None
    during: tuple[float, float] | None
    outside: list[tuple[float, float]]


def windows(
    records: Sequence[Sequence[float]], dry: int, archive: tuple[float, float] | None
) -> Windows:
    """Records: [worker, started, ended, pull ms, ack ms, jobs] (wall clock). The span: from
    every worker's first answer to the answer that brought the jobs pulled to `dry` (from then
    on too few are left for every worker to get a whole batch)."""
    if not records:
        return Windows(None, None, [])
    first: dict[float, float] = {}
    for r in records:
        first[r[0]] = min(first.get(r[0], r[2]), r[2])
    start = max(first.values())
    pulled, end = 0.0, max(r[2] for r in records)
    for r in sorted(records, key=lambda r: r[2]):
        pulled += r[5]
        if pulled >= dry:
            end = r[2]
            break
    if end <= start:
        return Windows(None, None, [])
    during = None
    if archive is not None:
        a, b = max(archive[0], start), min(archive[1], end)
        if b > a:
            during = (a, b)
    if during is None:
        outside = [(start, end)]
    else:
        outside = [w for w in ((start, during[0]), (during[1], end)) if w[1] > w[0]]
    return Windows((start, end), during, outside)


def inside(t: float, spans: Sequence[tuple[float, float]]) -> bool:
    return any(a <= t < b for a, b in spans)


async def cycle(
    variant: Variant,
    number: int,
    block: int,
    log: TextIO,
    say: Callable[[str], None],
) -> dict[str, Any]:
    plan = variant.plan
    assert variant.broker is not None
    began = time.monotonic()
    low, high = await variant.fill(block)
    filled = time.monotonic()
    records_path = variant.root / f"records-{number}.json"
    spec = {
        "ports": variant.broker.api_ports,
        "channel": CHANNEL,
        "consumer": CONSUMER,
        "channel_token": token(CHANNEL),
        "consumer_token": token(CONSUMER),
        "workers": plan.pollers,
        "batch": plan.batch,
        "target": block,
        "lead": LEAD,
        "records": str(records_path),
    }
    with (variant.root / "deliver.log").open("ab") as client_log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.retention",
            "deliver",
            json.dumps(spec),
            stdout=asyncio.subprocess.PIPE,
            stderr=client_log,
            cwd=REPO,
        )
    assert proc.stdout is not None
    archive_task: asyncio.Task[dict[str, Any]] | None = None
    archive_span: list[float] = []
    result: dict[str, Any] = {}

    async def archive() -> dict[str, Any]:
        archive_span.append(time.time())
        try:
            if plan.control:
                await asyncio.sleep(plan.control)
                return {"control": {"seconds": plan.control}}
            return await variant.archive(log)
        finally:
            archive_span.append(time.time())

    try:
        async with asyncio.timeout(max(900.0, block / 200.0)):
            async for raw in proc.stdout:
                message = json.loads(raw)
                if message["event"] == "lead" and variant.previous and archive_task is None:
                    archive_task = asyncio.create_task(archive())
                elif message["event"] == "result":
                    result = message
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    delivered_at = time.monotonic()
    if variant.previous and archive_task is None:  # the client never reached the lead
        archive_task = asyncio.create_task(archive())
    steps = await archive_task if archive_task is not None else {}
    rotated = await variant.rotate() if variant.partitions else None
    records = json.loads(records_path.read_text()) if records_path.exists() else []
    records_path.unlink(missing_ok=True)
    span = (archive_span[0], archive_span[1]) if len(archive_span) == 2 else None
    w = windows(records, block - plan.pollers * plan.batch, span)
    counts = await variant.count_windows(low, high, [*w.outside, *([w.during] if w.during else [])])
    outside = Phase(jobs=sum(counts[: len(w.outside)]), seconds=sum(b - a for a, b in w.outside))
    during = Phase()
    if w.during is not None:
        during = Phase(jobs=counts[-1], seconds=w.during[1] - w.during[0])
    for r in records:
        if w.during is not None and inside(r[1], [w.during]):
            during.pulls.append(r[3])
            during.acks.append(r[4])
        elif inside(r[1], w.outside):
            outside.pulls.append(r[3])
            outside.acks.append(r[4])
    if span is not None:
        # Only cycles that archive, so that both windows come from the same cycles: the first
        # cycle's table holds one block, and pooled with it a control run without any archive
        # measured 87% and 99% (docs/performance.md, "Retention").
        variant.outside.add(outside)
    variant.during.add(during)
    undelivered = await variant.undelivered(low, high)
    sizes = await variant.sizes()
    variant.previous = (block, low, high)
    row: dict[str, Any] = {
        "cycle": number,
        "jobs": block,
        "fill_s": round(filled - began, 3),
        "deliver_s": round(delivered_at - filled, 3),
        "archive_s": round(span[1] - span[0], 3) if span else None,
        "archive_steps": steps,
        "cycle_s": round(time.monotonic() - began, 3),
        "outside": outside.as_dict(),
        "during": during.as_dict(),
        "undelivered": undelivered,
        "client": {k: v for k, v in result.items() if k != "event"},
        "rotated_to": rotated,
        **sizes,
    }
    variant.cycles.append(row)
    say(
        f"  {NAMES[variant.name]} cycle {number + 1}: {block:,} jobs, fill {row['fill_s']:.1f}s, "
        f"deliver {row['deliver_s']:.1f}s, "
        + ("no archive" if span is None else f"archive {row['archive_s']:.1f}s")
        + f", job table {sizes['job_bytes'] / 1e6:,.1f} MB"
    )
    return row


async def run_retention(
    base_url: str,
    workdir: Path,
    plan: Plan,
    *,
    say: Callable[[str], None] = print,
) -> list[Measured]:
    """Both variants' cycles, alternating; two Measured rows per variant."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    variants = [Variant(name, base_url, workdir / name, plan) for name in plan.variants]
    log = (workdir / "pipeline.log").open("a")
    started = time.monotonic()
    replica: Any = None

    try:
        if plan.replica:
            from devtools.replica import standby_of

            # One replica of the whole cluster, for both variants: made before their
            # databases, which it then replays as they are created.
            replica = await asyncio.to_thread(
                standby_of, base_url, niceness=plan.archive_niceness, settings=REPLICA_SETTINGS
            )
            for variant in variants:
                variant.replica_base = replica.base_url
        for variant in variants:
            await variant.start()
        blocks = plan.blocks()
        say(
            f"  retention: {plan.jobs:,} jobs in {len(blocks)} cycles of about {blocks[0]:,} "
            f"({', '.join(NAMES[v.name] for v in variants)})"
        )
        for number, block in enumerate(blocks):
            for variant in variants:
                await cycle(variant, number, block, log, say)
    finally:
        for variant in variants:
            await variant.stop()
        if replica is not None:
            await asyncio.to_thread(replica.stop)
        log.close()
    elapsed = time.monotonic() - started
    out: list[Measured] = []
    for variant in variants:
        out += measured(variant, elapsed)
    return out


def archive_ran(plan: Plan) -> str:
    """How the archive ran, in words, for the report."""
    where = (
        f"reading a streaming replica started under nice -n {plan.archive_niceness}"
        if plan.replica
        else "reading the primary"
    )
    return (
        f"the archive ran as its own process (python -m app.pipeline archive, a Spark JVM per "
        f"run) at niceness {plan.archive_niceness}, {where}; marks, detach/drop and deletes "
        "on the primary"
    )


def measured(variant: Variant, elapsed: float) -> list[Measured]:
    plan = variant.plan
    label = LABELS[variant.name]
    rows = []
    for phase_name, phase in ((OUTSIDE, variant.outside), (DURING, variant.during)):
        m = Measured(
            f"{NAME_PREFIX}{label}): pull({plan.batch}) + batch ack, {plan.pollers} pollers, "
            f"{phase_name}",
            "ours",
            jobs=phase.jobs,
            seconds=phase.seconds,
            latency_ms={"pull": percentiles(phase.pulls), "ack": percentiles(phase.acks)},
            extra={"variant": variant.name, "phase": phase_name},
        )
        rows.append(m)
    summary = {
        "jobs": plan.jobs,
        "cycles": variant.cycles,
        "cycle_jobs": plan.blocks()[0],
        "lead": LEAD,
        "archive_ran": archive_ran(plan),
        "elapsed_s_all_variants": round(elapsed, 1),
        "database": variant.dbname,
        "outside": variant.outside.as_dict(),
        "during": variant.during.as_dict(),
        "fill": "publish statement's set-based form (message rows by generate_series and their "
        "keys, one job per message, the published count), chunks of " + f"{FILL_CHUNK:,}",
    }
    rows[1].extra["retention"] = summary
    return rows


# -- what the report shows -------------------------------------------------------------------------


def _variant_rows(results: Sequence[Measured]) -> dict[str, dict[str, Measured]]:
    found: dict[str, dict[str, Measured]] = {}
    for m in results:
        if m.name.startswith(NAME_PREFIX) and "variant" in m.extra:
            found.setdefault(m.extra["variant"], {})[m.extra["phase"]] = m
    return found


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def retention_targets(results: Sequence[Measured]) -> list[tuple[str, str, str, str]]:
    """(target, goal, measured, verdict) for each variant run: the archive's cost to throughput
    and claim latency, and the job table's size across cycles."""
    out = []
    for variant, rows in _variant_rows(results).items():
        outside, during = rows.get(OUTSIDE), rows.get(DURING)
        if outside is None or during is None:
            continue
        what = f"retention, {LABELS[variant]}"
        if outside.rate and during.seconds:
            x = during.rate / outside.rate
            measured = f"{x:.1%} ({during.rate:,.0f} vs {outside.rate:,.0f} jobs/s)"
            ok: bool | None = x >= 1 - RATIO_BOUND
        else:
            measured, ok = "no window with and without the archive", None
        out.append(
            (f"{what}: pull + batch ack while archiving vs not", ">= 90%", measured, _verdict(ok))
        )
        a, b = outside.latency_ms.get("pull", {}), during.latency_ms.get("pull", {})
        if a.get("n") and b.get("n"):
            p50, p99 = b["p50"] / a["p50"], b["p99"] / a["p99"]
            measured = (
                f"p50 {p50:.2f}x ({b['p50']:.1f} vs {a['p50']:.1f} ms), "
                f"p99 {p99:.2f}x ({b['p99']:.1f} vs {a['p99']:.1f} ms)"
            )
            ok = p50 <= 1 + RATIO_BOUND and p99 <= 1 + RATIO_BOUND
        else:
            measured, ok = "no pulls with and without the archive", None
        out.append(
            (f"{what}: claim p50 / p99 while archiving vs not", "<= 1.10x", measured, _verdict(ok))
        )
        cycles = during.extra.get("retention", {}).get("cycles", [])
        if len(cycles) >= 3:
            # The first cycle archives nothing: the table holds one block then, two after.
            first, last = cycles[1]["job_bytes"], cycles[-1]["job_bytes"]
            x = last / first if first else 0.0
            measured = (
                f"{x:.2f}x ({first / 1e6:,.1f} MB after cycle 2, {last / 1e6:,.1f} MB after "
                f"cycle {len(cycles)})"
            )
            ok = x <= FLAT_BOUND
        else:
            measured, ok = f"{len(cycles)} cycles: too few to tell", None
        out.append(
            (
                f"{what}: job table size, last cycle vs second",
                f"<= {FLAT_BOUND:.2f}x",
                measured,
                _verdict(ok),
            )
        )
    return out


def retention_sections(results: Sequence[Measured]) -> list[str]:
    found = _variant_rows(results)
    if not found:
        return []
    header = [
        "variant",
        "cycle",
        "jobs",
        "fill s",
        "deliver s",
        "archive s",
        "jobs/s outside",
        "jobs/s while archiving",
        "pull p50/p99 ms outside",
        "pull p50/p99 ms while archiving",
        "job table MB",
        "message table MB",
        "job dead tuples",
    ]
    lines = [header, ["---"] * len(header)]
    for variant, rows in found.items():
        during = rows.get(DURING)
        cycles = during.extra.get("retention", {}).get("cycles", []) if during else []
        for c in cycles:
            lines.append(
                [
                    LABELS[variant],
                    str(c["cycle"] + 1),
                    f"{c['jobs']:,}",
                    f"{c['fill_s']:.1f}",
                    f"{c['deliver_s']:.1f}",
                    "-" if c["archive_s"] is None else f"{c['archive_s']:.1f}",
                    _rate(c["outside"]),
                    _rate(c["during"]),
                    _lat(c["outside"]),
                    _lat(c["during"]),
                    f"{c['job_bytes'] / 1e6:,.1f}",
                    f"{c['message_bytes'] / 1e6:,.1f}",
                    f"{c['job_dead_tuples']:,}",
                ]
            )
    table = "\n".join("| " + " | ".join(cells) + " |" for cells in lines)
    ran = {
        str(rows[DURING].extra.get("retention", {}).get("archive_ran", ""))
        for rows in found.values()
        if DURING in rows
    }
    how = "".join(f"\n\nHow: {text}." for text in sorted(ran) if text)
    return [
        "Retention (issue 42): cycles of fill, pull + batch ack delivery and the previous "
        "block's archive, by variant" + how + "\n\n" + table
    ]


def _rate(phase: dict[str, Any]) -> str:
    return f"{phase['jobs_per_s']:,.0f}" if phase.get("seconds") else "-"


def _lat(phase: dict[str, Any]) -> str:
    pull = phase.get("pull_ms", {})
    return f"{pull['p50']:.1f} / {pull['p99']:.1f}" if pull.get("n") else "-"


# -- the delivering client (its own process) -------------------------------------------------------


async def deliver(spec: dict[str, Any]) -> None:
    """pull(batch) + batch ack by `workers` clients over the API processes until `target` jobs
    are acked (or the block stays dry); a "lead" line once LEAD of them are, then "result"."""
    target, batch = int(spec["target"]), int(spec["batch"])
    base = f"/channel/{spec['channel']}/consumer/{spec['consumer']}"
    headers = {
        "X-Broker-Channel-Token": spec["channel_token"],
        "X-Broker-Consumer-Token": spec["consumer_token"],
    }
    state = {"acked": 0, "lead": False}
    records: list[list[float]] = []
    statuses: Counter[str] = Counter()
    errors: list[str] = []

    async def worker(number: int, port: int) -> None:
        conn = Connection(port)
        empty = 0
        try:
            while state["acked"] < target and empty < EMPTY_STOP and len(errors) < 50:
                started, clock = time.time(), time.perf_counter()
                response = await conn.post_json(
                    f"{base}/pull", {"batch": batch, "expires": EXPIRES}, headers
                )
                pull_ms = (time.perf_counter() - clock) * 1000.0
                statuses[f"pull {response.status}"] += 1
                if response.status != 200:
                    errors.append(f"pull {response.status}: {response.body[:200]!r}")
                    await asyncio.sleep(0.05)
                    continue
                jobs = response.json()["Jobs"]
                if not jobs:
                    empty += 1
                    records.append([number, started, time.time(), pull_ms, 0.0, 0])
                    continue
                empty = 0
                acks = [{"id": j["ID"], "attempt": j["Attempt"], "type": "ack"} for j in jobs]
                clock = time.perf_counter()
                response = await conn.post_json(f"{base}/ack", {"acks": acks}, headers)
                ack_ms = (time.perf_counter() - clock) * 1000.0
                statuses[f"ack {response.status}"] += 1
                if response.status == 200:
                    done = sum(1 for r in response.json()["Results"] if r["status"] == 202)
                    state["acked"] = int(state["acked"]) + done
                else:
                    errors.append(f"ack {response.status}: {response.body[:200]!r}")
                records.append([number, started, time.time(), pull_ms, ack_ms, len(jobs)])
                if not state["lead"] and state["acked"] >= spec["lead"] * target:
                    state["lead"] = True
                    emit("lead")
        except HttpError as exc:
            errors.append(str(exc))
        finally:
            await conn.close()

    ports = spec["ports"]
    await asyncio.gather(*(worker(i, ports[i % len(ports)]) for i in range(int(spec["workers"]))))
    await asyncio.to_thread(Path(spec["records"]).write_text, json.dumps(records))
    emit("result", acked=state["acked"], statuses=dict(statuses), errors=errors[:5])


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] != "deliver":
        raise SystemExit("usage: python -m bench.retention deliver '<json spec>'")
    runner: Callable[[Any], Any] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    runner(deliver(json.loads(argv[1])))


if __name__ == "__main__":
    main(sys.argv[1:])
