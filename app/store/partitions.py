"""The job and message tables' partitions on PostgreSQL: made ahead, rotated, drained (jobs),
detached and dropped.

`job` is range-partitioned by its id (migration 0018_job_partitions, where the why is): each
partition holds the ids issued in one `[rdbms] partition-interval`, because the ids are what
acks, claims' updates and status reads find jobs by, so a look-up by id reaches one partition
(a time column would send every one of them to all). The ids of an interval are a span of
SPAN values: the next partition is made ahead, empty, with the next span, and the rotation
moves the sequence up to it (`setval`), so the ids stay one ascending sequence with a gap at
each rotation. A partition also rotates once three quarters of its span are used.

`job_partition` keeps each partition's state: ATTACHED (taking ids, or closed and waiting for
its retention), EXPORTED (the archive wrote and read back its rows), DETACHED, DROPPED. Every
step is one conditional statement or one transaction, and each looks at the state first, so a
run that stopped anywhere is finished by the next.

`message` is split the same way by its pk (migration 0020_message_partitions), its partitions
made and rotated with the job table's, their state in `message_partition`. Messages never move
(their pk is the NATS bridge's stream sequence and what jobs point at), so a message partition
goes only once no job points into it: closed, past the retention, its messages archived (the
pipeline exports it whole once nothing points into it, app/pipeline/partitions.py; until then
the batch archive deletes those no job refers to any more, with their keys in message_key, and
a partition they leave empty is marked EXPORTED here). An exported one is detached first; once
detached nothing can reach its messages, and if a job made while it detached points into it,
it is attached again (EXPORTED, its keys kept, so a publish repeating one of its ids is still
refused); otherwise its keys go, a chunk at a time, and then the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text

from app.domain.counters import COUNTER_SHARDS
from app.store.db import Database, Tx
from app.store.schema import JOB_PARTITION_WITH

SPAN = 1 << 32  # ids per partition; 2**21 rotations stay below 2**53 (JavaScript's integers)
ROTATE_AT = SPAN * 3 // 4  # ids used in a partition that close it early
MIN_ID = -(1 << 63)
SEQUENCE = "job_id_seq"
# A queued job due now in a partition being drained is first made due a little later (an
# ordinary update, which a claim running meanwhile re-checks and skips) and moved a round
# later: a claim that read the row before a move and tried to lock it after would fail with a
# serialization error, while one that finds it not due never locks it.
# Creating a partition attaches it (SHARE UPDATE EXCLUSIVE on job: claims and acks go on), but
# its foreign key takes a brief lock on consumer that publishes wait behind; past
# this the attempt gives up and the next round tries again.
LOCK_TIMEOUT = "500ms"

ATTACHED, EXPORTED, DETACHED, DROPPED = "ATTACHED", "EXPORTED", "DETACHED", "DROPPED"
STATES = (ATTACHED, EXPORTED, DETACHED, DROPPED)
PENDING = "PENDING"  # a table's attachment only (attachment()), never a state row's


@dataclass(frozen=True, slots=True)
class Partitioned:
    """A partitioned table: the sequence that issues its partition key, the table keeping its
    partitions' state, and each partition's storage parameters."""

    table: str
    sequence: str
    state: str
    storage: Mapping[str, str]

    @property
    def prefix(self) -> str:
        return f"{self.table}_p"


JOBS = Partitioned("job", SEQUENCE, "job_partition", JOB_PARTITION_WITH)
MESSAGES = Partitioned("message", "message_pk_seq", "message_partition", {})


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    lower_id: int | None  # None: from the smallest id (the table the migration converted)
    upper_id: int
    opened_at: datetime | None
    closed_at: datetime | None
    status: str
    exported_rows: int | None

    @property
    def low(self) -> int:
        return MIN_ID if self.lower_id is None else self.lower_id


def partition_name(lower_id: int | None, of: Partitioned = JOBS) -> str:
    return f"{of.prefix}0" if lower_id is None else f"{of.prefix}{lower_id // SPAN}"


# Statements on a table's partitions and their state: {state}, {sequence} and {table} are those
# of a Partitioned (constants of this module, never input).
LIST = """
SELECT name, lower_id, upper_id, opened_at, closed_at, status, exported_rows
FROM {state} WHERE status <> 'DROPPED' ORDER BY upper_id
"""

STATE_COUNTS = "SELECT status, count(*) FROM {state} GROUP BY status"

# The next id the sequence hands out.
POSITION = "SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM {sequence}"

REGISTER = """
INSERT INTO {state} (name, lower_id, upper_id, status, changed_at)
VALUES (:name, :lower, :upper, 'ATTACHED', now())
ON CONFLICT (name) DO NOTHING
RETURNING name
"""

MARK_OPENED = """
UPDATE {state} SET opened_at = now(), changed_at = now()
WHERE name = :name AND opened_at IS NULL
"""

CLOSE = """
UPDATE {state} SET closed_at = now(), changed_at = now()
WHERE name = :name AND closed_at IS NULL
"""

# Conditional: ids only move up, and only the sweeper that opened the partition gets here.
JUMP = """
SELECT setval('{sequence}', :lower, false) WHERE (SELECT last_value FROM {sequence}) < :lower
"""

HOLD = """
UPDATE job SET earliest_next_attempt_at = now() + make_interval(secs => :hold)
WHERE id IN (
    SELECT id FROM job
    WHERE id >= :low AND id < :high AND status = 'QUEUED' AND earliest_next_attempt_at <= now()
    ORDER BY id LIMIT :chunk FOR UPDATE SKIP LOCKED
) AND status = 'QUEUED' AND earliest_next_attempt_at <= now()
"""

# A new id is a move to the current partition (PostgreSQL deletes and inserts the row; the
# statement's transition tables see an update, so job_count nets to nothing). Not moved: jobs
# in flight (their ack finds them by id; they come back QUEUED or end), due ones (HOLD first),
# and a consumer's while a redrive of it runs (it walks ids up to a bound and would miss them).
MOVE = f"""
UPDATE job SET id = nextval('{SEQUENCE}')
WHERE id IN (
    SELECT j.id FROM job j
    WHERE j.id >= :low AND j.id < :high
      AND (j.status = 'DEAD' OR (j.status = 'QUEUED' AND j.earliest_next_attempt_at > now()))
      AND NOT EXISTS (
          SELECT 1 FROM redrive r WHERE r.consumer_pk = j.consumer_pk AND r.status = 'RUNNING'
      )
    ORDER BY j.id LIMIT :chunk FOR UPDATE SKIP LOCKED
) AND (status = 'DEAD' OR (status = 'QUEUED' AND earliest_next_attempt_at > now()))
"""

UNFINISHED = """
SELECT count(*) FROM (
    SELECT 1 FROM job WHERE id >= :low AND id < :high AND status <> 'DELIVERED' LIMIT 1
) AS any_left
"""

MARK_EXPORTED = """
UPDATE {state} SET status = 'EXPORTED', exported_rows = :rows, changed_at = now()
WHERE name = :name AND status = 'ATTACHED' AND closed_at IS NOT NULL
"""

MARK_DETACHED = """
UPDATE {state} SET status = 'DETACHED', changed_at = now()
WHERE name = :name AND status = 'EXPORTED'
"""

MARK_DROPPED = """
UPDATE {state} SET status = 'DROPPED', changed_at = now()
WHERE name = :name AND status = 'DETACHED'
RETURNING name
"""

# Whether a partition is still attached, and whether a DETACH ... CONCURRENTLY of it stopped
# half way (pg_inherits.inhdetachpending): FINALIZE completes that one.
ATTACHMENT = """
SELECT i.inhdetachpending FROM pg_inherits i
WHERE i.inhrelid = to_regclass(:name) AND i.inhparent = '{table}'::regclass
"""

# A closed message partition past the retention whose messages have all been archived (the
# batch archive deletes each once no job refers to it): nothing in it to export, so it is
# marked as exported with no rows. Its emptiness is asked in the statement that marks it.
MARK_EMPTIED = """
UPDATE message_partition SET status = 'EXPORTED', exported_rows = 0, changed_at = now()
WHERE name = :name AND status = 'ATTACHED' AND closed_at IS NOT NULL
  AND closed_at <= now() - make_interval(days => :days)
  AND NOT EXISTS (SELECT 1 FROM message WHERE pk >= :low AND pk < :high)
"""

# Jobs that still point into a message partition (ix_job_message_pk of each job partition), or
# a job partition detached but not dropped (its drop may re-home rows pointing into it).
REFERENCED = """
SELECT EXISTS (SELECT 1 FROM job WHERE message_pk >= :low AND message_pk < :high)
    OR EXISTS (SELECT 1 FROM job_partition WHERE status IN ('EXPORTED', 'DETACHED'))
"""

# A detached message partition's ids leave message_key once nothing points into it (nothing
# cascades from message: migration 0021), a chunk a statement, before its drop: from then on
# the ids are free again, as an archived message's always were. Not before the detach: a
# partition attached again must come back with its keys.
FORGET_KEYS = """
DELETE FROM message_key WHERE (channel_id, message_id) IN (
    SELECT channel_id, message_id FROM message_key
    WHERE message_pk >= :low AND message_pk < :high LIMIT :chunk
)
"""

EXISTS = "SELECT to_regclass(:name) IS NOT NULL"

# A detached message partition's bounds, its state row locked (two sweepers: one re-attaches).
DETACHED_BOUNDS = """
SELECT lower_id, upper_id FROM message_partition
WHERE name = :name AND status = 'DETACHED' FOR UPDATE
"""

# Jobs pointing into a detached message partition: made by a history copy whose statement
# still saw the partition, committed before its DETACH ... CONCURRENTLY finished (which waits
# for every such statement). Asked again before the drop, which would leave them pointing at
# nothing: the partition goes back in its place instead, EXPORTED, and waits for them.
POINTED_INTO = "SELECT EXISTS (SELECT 1 FROM job WHERE message_pk >= :low AND message_pk < :high)"

MARK_REATTACHED = """
UPDATE message_partition SET status = 'EXPORTED', changed_at = now()
WHERE name = :name AND status = 'DETACHED'
"""

# Rows of a detached partition that are not finished (a redrive replayed them after the export):
# back into job with new ids, where their consumer and message still exist. Each message is
# locked FOR KEY SHARE, as a foreign key's check would (none points at message: migration 0021),
# so that the archive cannot delete it under the new job.
REHOME = """
INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size, attempt, retry_count,
    timeout_count, incremental_timeout, lease_expires_at, earliest_next_attempt_at, claimed_at,
    status_changed_at, created_at, dead_reason, last_error, attempts)
SELECT d.message_pk, d.consumer_pk, CASE WHEN d.status = 'INFLIGHT' THEN 'QUEUED' ELSE d.status END,
    d.priority, d.payload_size, d.attempt, d.retry_count, d.timeout_count,
    d.incremental_timeout, NULL, d.earliest_next_attempt_at, NULL, d.status_changed_at,
    d.created_at, d.dead_reason, d.last_error, d.attempts
FROM {name} d JOIN message m ON m.pk = d.message_pk
WHERE d.status <> 'DELIVERED'
  AND EXISTS (SELECT 1 FROM consumer c WHERE c.pk = d.consumer_pk)
FOR KEY SHARE OF m
"""

# The dropped rows leave job_count (no trigger sees a DROP) and, those not re-homed, are
# counted as removed on purpose in the ledger, as the archive's row deletes are.
UNCOUNT = """
INSERT INTO job_count (consumer_pk, status, shard, n)
SELECT consumer_pk, status, pg_backend_pid() % {shards}, -count(*)
FROM {name} GROUP BY consumer_pk, status ORDER BY consumer_pk, status
ON CONFLICT (consumer_pk, status, shard) DO UPDATE SET n = job_count.n + excluded.n
"""
COUNT_REMOVED = """
INSERT INTO job_removed (consumer_pk, shard, n)
SELECT consumer_pk, pg_backend_pid() % {shards}, count(*)
FROM {name} d
WHERE d.status = 'DELIVERED'
   OR NOT EXISTS (SELECT 1 FROM consumer c WHERE c.pk = d.consumer_pk)
   OR NOT EXISTS (SELECT 1 FROM message m WHERE m.pk = d.message_pk)
GROUP BY consumer_pk ORDER BY consumer_pk
ON CONFLICT (consumer_pk, shard) DO UPDATE SET n = job_removed.n + excluded.n
"""


def _partition(row: Any) -> Partition:
    return Partition(row[0], row[1], row[2], row[3], row[4], row[5], row[6])


def _ident(name: str, of: Partitioned = JOBS) -> str:
    """Partition names are made here (job_p<number>, message_p<number>), never taken from
    input: checked anyway before they go into DDL."""
    if not (name.startswith(of.prefix) and name[len(of.prefix) :].isdigit()):
        raise ValueError(f"not a {of.table} partition: {name!r}")
    return name


class PartitionStore:
    """Statements on the partitions' state and the partitions themselves (PostgreSQL only), of
    the job table or (`of=MESSAGES`) the message table."""

    def __init__(self, db: Database, of: Partitioned = JOBS) -> None:
        self._db = db
        self._of = of

    @property
    def of(self) -> Partitioned:
        return self._of

    def _sql(self, template: str) -> str:
        of = self._of
        return template.format(state=of.state, sequence=of.sequence, table=of.table)

    async def partitions(self) -> list[Partition]:
        rows = await self._db.run_alone(self._sql(LIST), {}, prepare=False)
        return [_partition(r) for r in rows]

    async def state_counts(self) -> dict[str, int]:
        """Partitions by state, every state named (0 where none)."""
        rows = await self._db.run_alone(self._sql(STATE_COUNTS), {}, prepare=False)
        counted = {str(r[0]): int(r[1]) for r in rows}
        return {state: counted.get(state, 0) for state in STATES}

    async def position(self) -> int:
        rows = await self._db.run_alone(self._sql(POSITION), {}, prepare=False)
        return int(rows[0][0])

    async def now(self) -> datetime:
        rows = await self._db.run_alone("SELECT now()", {}, prepare=False)
        value: datetime = rows[0][0]
        return value

    async def create(self, lower_id: int) -> bool:
        """The partition of ids [lower_id, lower_id + SPAN), made and attached in one
        transaction with its state row (False: another sweeper made it)."""
        of = self._of
        name = _ident(partition_name(lower_id, of), of)
        upper = lower_id + SPAN
        storage = ", ".join(f"{k} = {v}" for k, v in of.storage.items())
        async with self._db.transaction() as tx:
            await tx.conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
            made = await tx.conn.execute(
                text(self._sql(REGISTER)), {"name": name, "lower": lower_id, "upper": upper}
            )
            if made.scalar_one_or_none() is None:
                return False
            # Made apart and attached: CREATE ... PARTITION OF would lock the table against
            # claims (job) or publishes (message).
            await tx.conn.execute(
                text(
                    f"CREATE TABLE {name}"
                    f" (LIKE {of.table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
                    + (f" WITH ({storage})" if storage else "")
                )
            )
            await tx.conn.execute(
                text(
                    f"ALTER TABLE {of.table} ATTACH PARTITION {name}"
                    f" FOR VALUES FROM ({lower_id}) TO ({upper})"
                )
            )
        return True

    async def mark_opened(self, name: str) -> None:
        async with self._db.transaction() as tx:
            await tx.conn.execute(text(self._sql(MARK_OPENED)), {"name": name})

    async def rotate(self, current: str, following: Partition) -> bool:
        """Close `current` and hand out ids from `following` on (False: already done)."""
        assert following.lower_id is not None
        async with self._db.transaction() as tx:
            opened = await tx.conn.execute(text(self._sql(MARK_OPENED)), {"name": following.name})
            if opened.rowcount == 0:
                return False
            await tx.conn.execute(text(self._sql(CLOSE)), {"name": current})
            # setval is not undone by a rollback: should the commit fail, the next round finds
            # the sequence in `following` and marks it opened (maintain()).
            await tx.conn.execute(text(self._sql(JUMP)), {"lower": following.lower_id})
        return True

    async def close(self, name: str) -> None:
        async with self._db.transaction() as tx:
            await tx.conn.execute(text(self._sql(CLOSE)), {"name": name})

    async def hold_due(self, part: Partition, chunk: int, hold_seconds: float) -> int:
        async with self._db.transaction() as tx:
            result = await tx.conn.execute(
                text(HOLD),
                {"low": part.low, "high": part.upper_id, "chunk": chunk, "hold": hold_seconds},
            )
            return int(result.rowcount)

    async def move_forward(self, part: Partition, chunk: int) -> int:
        async with self._db.transaction() as tx:
            result = await tx.conn.execute(
                text(MOVE), {"low": part.low, "high": part.upper_id, "chunk": chunk}
            )
            return int(result.rowcount)

    async def has_unfinished(self, part: Partition) -> bool:
        async with self._db.transaction() as tx:
            found = await tx.conn.execute(
                text(UNFINISHED), {"low": part.low, "high": part.upper_id}
            )
            return bool(found.scalar_one())

    async def mark_exported(self, name: str, rows: int) -> bool:
        async with self._db.transaction() as tx:
            done = await tx.conn.execute(
                text(self._sql(MARK_EXPORTED)), {"name": name, "rows": rows}
            )
            return bool(done.rowcount)

    async def mark_emptied(self, part: Partition, retention_days: int) -> bool:
        """A closed message partition past the retention with no message left: EXPORTED."""
        assert self._of is MESSAGES
        async with self._db.transaction() as tx:
            done = await tx.conn.execute(
                text(MARK_EMPTIED),
                {
                    "name": part.name,
                    "days": retention_days,
                    "low": part.low,
                    "high": part.upper_id,
                },
            )
            return bool(done.rowcount)

    async def referenced(self, part: Partition) -> bool:
        """Whether any job still points into this message partition."""
        async with self._db.transaction() as tx:
            found = await tx.conn.execute(
                text(REFERENCED), {"low": part.low, "high": part.upper_id}
            )
            return bool(found.scalar_one())

    async def forget_keys(self, part: Partition, chunk: int) -> int:
        async with self._db.transaction() as tx:
            result = await tx.conn.execute(
                text(FORGET_KEYS), {"low": part.low, "high": part.upper_id, "chunk": chunk}
            )
            return int(result.rowcount)

    async def attachment(self, name: str) -> str:
        """ATTACHED, PENDING (a DETACH ... CONCURRENTLY stopped half way: it keeps every other
        concurrent detach of the table out until finalized) or DETACHED."""
        name = _ident(name, self._of)
        async with self._db.transaction() as tx:
            found = (await tx.conn.execute(text(self._sql(ATTACHMENT)), {"name": name})).all()
        if not found:
            return DETACHED
        return PENDING if found[0][0] else ATTACHED

    async def detach(self, name: str) -> None:
        """DETACH ... CONCURRENTLY (no transaction around it; claims, acks and publishes go
        on), or FINALIZE one that a crash interrupted; then the state says DETACHED."""
        name = _ident(name, self._of)
        async with self._db.transaction() as tx:
            attached = (await tx.conn.execute(text(self._sql(ATTACHMENT)), {"name": name})).all()
        if attached:
            how = "FINALIZE" if attached[0][0] else "CONCURRENTLY"
            await self._db.run_alone(
                f"ALTER TABLE {self._of.table} DETACH PARTITION {name} {how}", {}, prepare=False
            )
        async with self._db.transaction() as tx:
            await tx.conn.execute(text(self._sql(MARK_DETACHED)), {"name": name})

    async def reattach_if_pointed_into(self, name: str) -> bool:
        """A detached message partition that a job points into (made by a history copy whose
        statement still saw it while it detached), attached again and EXPORTED, its keys
        intact; False: nothing points into it (nothing can any more: it is detached)."""
        assert self._of is MESSAGES
        name = _ident(name, self._of)
        async with self._db.transaction() as tx:
            return await self._reattached(tx, name)

    async def drop(self, name: str) -> bool:
        """Job partitions: re-home what a redrive woke in it since the export, take its rows
        out of the counts and the ledger, and drop it; message partitions: drop it (attached
        again instead should a job point into it after all). One transaction, with the
        state's change."""
        name = _ident(name, self._of)
        async with self._db.transaction() as tx:
            if self._of is MESSAGES and await self._reattached(tx, name):
                return False
            done = await tx.conn.execute(text(self._sql(MARK_DROPPED)), {"name": name})
            if done.scalar_one_or_none() is None:
                return False
            exists = await tx.conn.execute(text(EXISTS), {"name": name})
            if exists.scalar_one():
                if self._of is JOBS:
                    await tx.conn.execute(text(REHOME.format(name=name)))
                    await tx.conn.execute(
                        text(COUNT_REMOVED.format(name=name, shards=COUNTER_SHARDS))
                    )
                    await tx.conn.execute(text(UNCOUNT.format(name=name, shards=COUNTER_SHARDS)))
                await tx.conn.execute(text(f"DROP TABLE {name}"))
        return True

    async def _reattached(self, tx: Tx, name: str) -> bool:
        """A detached message partition that a job points into, attached again (its CHECK
        from the detach spares the scan) and EXPORTED; False: nothing points into it."""
        bounds = (await tx.conn.execute(text(DETACHED_BOUNDS), {"name": name})).first()
        if bounds is None:
            return False
        lower, upper = bounds[0], int(bounds[1])
        low = MIN_ID if lower is None else int(lower)
        pointed = await tx.conn.execute(text(POINTED_INTO), {"low": low, "high": upper})
        if (
            not pointed.scalar_one()
            or not (await tx.conn.execute(text(EXISTS), {"name": name})).scalar_one()
        ):
            return False
        start = "MINVALUE" if lower is None else str(low)
        # SHARE UPDATE EXCLUSIVE on message, as a partition made ahead takes: publishes and
        # reads go on.
        bounds_sql = f"FOR VALUES FROM ({start}) TO ({upper})"
        await tx.conn.execute(text(f"ALTER TABLE message ATTACH PARTITION {name} {bounds_sql}"))
        await tx.conn.execute(text(MARK_REATTACHED), {"name": name})
        return True
