"""The archive state machine in PostgreSQL: PLANNED -> EXPORTED -> DELETED, one batch at a time.

Planning freezes a batch's message ids together with a fingerprint of each message's jobs. The
delete re-checks, under row locks, that those jobs are still terminal and unchanged since
planning; a message whose job moved (a dead job requeued, say) stays in the database, is marked
`kept`, and is removed from the batch's Parquet files before the batch counts as finalized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from app.domain.counters import COUNTER_SHARDS

PLANNED = "PLANNED"
EXPORTED = "EXPORTED"
DELETED = "DELETED"

# What "unchanged" means for a job: any transition rewrites status_changed_at (database clock),
# claims bump attempt, and the counters only grow. Epoch seconds keep it independent of TimeZone.
_JOB_FINGERPRINT = """
    md5(coalesce(string_agg(concat_ws(':', j.id, j.status, j.attempt, j.retry_count,
        j.timeout_count, extract(epoch FROM j.status_changed_at)), ',' ORDER BY j.id), ''))
"""

# The message partitions whose messages the batches leave alone (ranges of pk, computed once a
# statement): those exported whole or on their way out, and those the partition archive takes
# whole (app/pipeline/partitions.py, which runs first): closed before the cutoff with no job
# pointing into them (app/store/partitions.py REFERENCED; a job partition exported or detached
# counts as pointing into every one). A message is archived once, by one path or the other.
_WHOLE = """
whole AS MATERIALIZED (
    SELECT coalesce(p.lower_id, -9223372036854775807 - 1) AS low, p.upper_id AS high
      FROM message_partition p
     WHERE p.status <> 'ATTACHED'
        OR (p.closed_at IS NOT NULL AND p.closed_at <= {cutoff}
            AND NOT EXISTS (SELECT 1 FROM job x
                             WHERE x.message_pk >= coalesce(p.lower_id, -9223372036854775807 - 1)
                               AND x.message_pk < p.upper_id)
            AND NOT EXISTS (SELECT 1 FROM job_partition q
                             WHERE q.status IN ('EXPORTED', 'DETACHED')))
)"""

_NOT_WHOLE = "NOT EXISTS (SELECT 1 FROM whole w WHERE m.pk >= w.low AND m.pk < w.high)"

_PLAN_MEMBERS = f"""
WITH {_WHOLE.format(cutoff="%(cutoff)s")}
INSERT INTO archive_batch_message (batch_id, message_pk, job_count, jobs_hash)
SELECT %(batch_id)s, picked.pk, count(j.id), {_JOB_FINGERPRINT}
  FROM (SELECT m.pk
          FROM message m
         WHERE m.received_at < %(cutoff)s
           AND m.pk > %(after)s
           AND NOT EXISTS (SELECT 1 FROM job x
                            WHERE x.message_pk = m.pk AND x.status <> ALL(%(terminal)s))
           AND {_NOT_WHOLE}
         ORDER BY m.pk
         LIMIT %(limit)s) AS picked
  LEFT JOIN job j ON j.message_pk = picked.pk
 GROUP BY picked.pk
"""

_ELIGIBLE = f"""
WITH {_WHOLE.format(cutoff="now() - make_interval(days => %(days)s)")}
SELECT count(*) AS messages, coalesce(sum(n), 0) AS jobs
  FROM (SELECT (SELECT count(*) FROM job j WHERE j.message_pk = m.pk) AS n
          FROM message m
         WHERE m.received_at < now() - make_interval(days => %(days)s)
           AND NOT EXISTS (SELECT 1 FROM job x
                            WHERE x.message_pk = m.pk AND x.status <> ALL(%(terminal)s))
           AND {_NOT_WHOLE}) AS e
"""

# The batch's messages first (FOR UPDATE, in pk order): a history copy of the NATS bridge that
# makes a job for one of them holds a KEY SHARE lock on it until it commits (app/store/backfill.py;
# no foreign key does it since migration 0021), so the copy either committed before, and its
# job keeps the message below, or waits for this transaction and skips the message gone.
_LOCK_MESSAGES = """
SELECT count(*) FROM (
    SELECT m.pk FROM message m JOIN archive_batch_message b ON b.message_pk = m.pk
     WHERE b.batch_id = %(batch_id)s ORDER BY m.pk FOR UPDATE OF m) AS locked
"""

# Then every job of the batch: a concurrent transition then either committed before (and the
# fingerprint below sees it) or waits for this transaction and finds its row gone.
_LOCK_JOBS = """
SELECT count(*) FROM (
    SELECT j.id FROM job j JOIN archive_batch_message b ON b.message_pk = j.message_pk
     WHERE b.batch_id = %(batch_id)s ORDER BY j.id FOR UPDATE OF j) AS locked
"""

# Row by row through indexes: linear in the batch whatever the planner's estimates.
_MARK_KEPT = f"""
UPDATE archive_batch_message b
   SET kept = NOT (
           EXISTS (SELECT 1 FROM message m WHERE m.pk = b.message_pk)
       AND NOT EXISTS (SELECT 1 FROM job x
                        WHERE x.message_pk = b.message_pk AND x.status <> ALL(%(terminal)s))
       AND (SELECT {_JOB_FINGERPRINT} FROM job j WHERE j.message_pk = b.message_pk)
           = b.jobs_hash)
 WHERE b.batch_id = %(batch_id)s
"""

# The archived jobs, deleted and counted removed in the delivery ledger (app/store/ledger.py
# reads it; the shard is the connection's, as there), by consumer in key order.
_DELETE_JOBS = f"""
WITH gone AS (
    DELETE FROM job j USING archive_batch_message b
     WHERE b.batch_id = %(batch_id)s AND NOT b.kept AND j.message_pk = b.message_pk
    RETURNING j.consumer_pk
), counted AS (
    INSERT INTO job_removed (consumer_pk, shard, n)
    SELECT consumer_pk, pg_backend_pid() %% {COUNTER_SHARDS}, count(*) FROM gone
     GROUP BY consumer_pk ORDER BY consumer_pk
    ON CONFLICT (consumer_pk, shard) DO UPDATE SET n = job_removed.n + excluded.n
)
SELECT count(*) FROM gone
"""

# The archived messages that no job points at any more, and their keys in message_key (the
# duplicate check: an archived message's id is free again). Nothing cascades from message
# (migration 0021): a message a job still points at stays.
_DELETE_MESSAGES = """
WITH gone AS (
    DELETE FROM message m USING archive_batch_message b
     WHERE b.batch_id = %(batch_id)s AND NOT b.kept AND m.pk = b.message_pk
       AND NOT EXISTS (SELECT 1 FROM job j WHERE j.message_pk = m.pk)
    RETURNING m.pk, m.channel_id, m.message_id
), forgotten AS (
    DELETE FROM message_key k USING gone
     WHERE k.channel_id = gone.channel_id AND k.message_id = gone.message_id
       AND k.message_pk = gone.pk
)
SELECT count(*) FROM gone
"""

# A message the delete above left: a job was made for it after _MARK_KEPT without the message's
# lock (every such insert takes one). Its planned jobs are deleted already, so the transaction
# rolls back rather than keep it: the batch stays EXPORTED and the next run's _MARK_KEPT keeps
# the message with its jobs.
_LEFT = """
SELECT count(*) FROM archive_batch_message b JOIN message m ON m.pk = b.message_pk
 WHERE b.batch_id = %(batch_id)s AND NOT b.kept
"""


class ArchiveRace(RuntimeError):
    """A batch's delete found a message it had planned to delete given a new job meanwhile."""


@dataclass(frozen=True, slots=True)
class Batch:
    id: int
    status: str
    cutoff: datetime
    message_count: int
    job_count: int
    first_message_pk: int
    last_message_pk: int
    finalized: bool
    kept_message_count: int = 0
    deleted_message_count: int = 0
    deleted_job_count: int = 0


@dataclass(frozen=True, slots=True)
class DeleteOutcome:
    messages: int
    jobs: int
    kept: int


def _batch(row: dict[str, Any]) -> Batch:
    return Batch(
        id=row["id"],
        status=row["status"],
        cutoff=row["cutoff"],
        message_count=row["message_count"],
        job_count=row["job_count"],
        first_message_pk=row["first_message_pk"] or 0,
        last_message_pk=row["last_message_pk"] or 0,
        finalized=row["finalized"],
        kept_message_count=row["kept_message_count"],
        deleted_message_count=row["deleted_message_count"],
        deleted_job_count=row["deleted_job_count"],
    )


class BatchStore:
    """Each method is one transaction on the given (non-autocommit) connection."""

    def __init__(self, conn: psycopg.Connection[Any], terminal: Sequence[str]) -> None:
        self._conn = conn
        self._terminal = list(terminal)

    def unfinished(self) -> list[Batch]:
        """Batches a crashed run left behind, oldest first: resume them before planning more."""
        return self._batches("status <> 'DELETED' OR NOT finalized")

    def deleted(self) -> list[Batch]:
        return self._batches("status = 'DELETED'")

    def _batches(self, where: str) -> list[Batch]:
        with self._conn.transaction(), self._conn.cursor(row_factory=dict_row) as cur:
            cur.execute(f"SELECT * FROM archive_batch WHERE {where} ORDER BY id")
            return [_batch(row) for row in cur.fetchall()]

    def partitions_gone(self) -> list[str]:
        """Job partitions archived whole and no longer part of job (app/pipeline/partitions)."""
        with self._conn.transaction():
            rows = self._conn.execute(
                "SELECT name FROM job_partition WHERE status IN ('DETACHED', 'DROPPED')"
                " ORDER BY upper_id"
            ).fetchall()
        return [str(r[0]) for r in rows]

    def partitions_in_flight(self) -> list[str]:
        """Job partitions exported but not yet dropped by the broker. A detached one's rows are
        not in job, so a message of its jobs would look jobless to the planner, while its drop
        may re-home some of them (a redrive woke them) onto that message: no batch is planned
        meanwhile."""
        with self._conn.transaction():
            rows = self._conn.execute(
                "SELECT name FROM job_partition WHERE status IN ('EXPORTED', 'DETACHED')"
                " ORDER BY upper_id"
            ).fetchall()
        return [str(r[0]) for r in rows]

    def get(self, batch_id: int) -> Batch:
        with self._conn.transaction(), self._conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT * FROM archive_batch WHERE id = %s", (batch_id,))
            row = cur.fetchone()
            assert row is not None, f"archive batch {batch_id} vanished"
            return _batch(row)

    def eligible(self, retention_days: int) -> tuple[int, int]:
        """How many messages (and their jobs) an archive run would take now; for --dry-run."""
        with self._conn.transaction():
            row = self._conn.execute(
                _ELIGIBLE, {"days": retention_days, "terminal": self._terminal}
            ).fetchone()
            assert row is not None
            return int(row[0]), int(row[1])

    def plan(self, retention_days: int, limit: int, after_pk: int) -> Batch | None:
        """Freeze the next `limit` eligible messages after `after_pk`; None when none is left."""
        planned = False
        with self._conn.transaction() as tx:
            row = self._conn.execute(
                "INSERT INTO archive_batch (status, cutoff, planned_at)"
                " VALUES ('PLANNED', now() - make_interval(days => %s), now())"
                " RETURNING id, cutoff",
                (retention_days,),
            ).fetchone()
            assert row is not None
            batch_id, cutoff = row
            params = {
                "batch_id": batch_id,
                "cutoff": cutoff,
                "after": after_pk,
                "terminal": self._terminal,
                "limit": limit,
            }
            if self._conn.execute(_PLAN_MEMBERS, params).rowcount == 0:
                raise psycopg.Rollback(tx)  # no empty batches; the block swallows this
            self._conn.execute(
                "UPDATE archive_batch SET (message_count, job_count, first_message_pk,"
                " last_message_pk) = (SELECT count(*), sum(job_count), min(message_pk),"
                " max(message_pk) FROM archive_batch_message WHERE batch_id = %(id)s)"
                " WHERE id = %(id)s",
                {"id": batch_id},
            )
            # Fresh statistics, so the export and delete statements get index plans.
            self._conn.execute("ANALYZE archive_batch_message")
            planned = True
        return self.get(batch_id) if planned else None

    def recount(self, batch_id: int) -> tuple[int, int]:
        """Messages and jobs of the batch still in the database: what the export must hold."""
        with self._conn.transaction():
            row = self._conn.execute(
                "SELECT count(m.pk), coalesce(sum((SELECT count(*) FROM job j"
                " WHERE j.message_pk = m.pk)), 0)"
                " FROM archive_batch_message b JOIN message m ON m.pk = b.message_pk"
                " WHERE b.batch_id = %s",
                (batch_id,),
            ).fetchone()
            assert row is not None
            return int(row[0]), int(row[1])

    def mark_exported(self, batch_id: int, messages: int, jobs: int) -> None:
        self._move(
            batch_id,
            PLANNED,
            "status = 'EXPORTED', exported_at = now(), message_count = %(m)s, job_count = %(j)s",
            {"m": messages, "j": jobs},
        )

    def delete(self, batch_id: int, lock_timeout_seconds: int = 60) -> DeleteOutcome:
        """Delete the batch's unchanged, still-terminal messages and jobs in ONE transaction."""
        params = {"batch_id": batch_id, "terminal": self._terminal}
        with self._conn.transaction():
            self._conn.execute(f"SET LOCAL lock_timeout = '{int(lock_timeout_seconds)}s'")
            self._conn.execute(_LOCK_MESSAGES, params)
            self._conn.execute(_LOCK_JOBS, params)
            self._conn.execute(_MARK_KEPT, params)
            row = self._conn.execute(_DELETE_JOBS, params).fetchone()
            jobs = int(row[0]) if row else 0
            row = self._conn.execute(_DELETE_MESSAGES, params).fetchone()
            messages = int(row[0]) if row else 0
            row = self._conn.execute(_LEFT, params).fetchone()
            if row and row[0]:
                raise ArchiveRace(
                    f"batch {batch_id}: {row[0]} archived messages got a job during the delete;"
                    " rolled back, the next run keeps them"
                )
            row = self._conn.execute(
                "SELECT count(*) FROM archive_batch_message WHERE batch_id = %s AND kept",
                (batch_id,),
            ).fetchone()
            kept = int(row[0]) if row else 0
            self._move(
                batch_id,
                EXPORTED,
                "status = 'DELETED', deleted_at = now(), deleted_message_count = %(m)s,"
                " deleted_job_count = %(j)s, kept_message_count = %(k)s, finalized = %(f)s",
                {"m": messages, "j": jobs, "k": kept, "f": kept == 0},
            )
        return DeleteOutcome(messages=messages, jobs=jobs, kept=kept)

    def kept(self, batch_id: int) -> list[int]:
        with self._conn.transaction():
            rows = self._conn.execute(
                "SELECT message_pk FROM archive_batch_message WHERE batch_id = %s AND kept"
                " ORDER BY message_pk",
                (batch_id,),
            ).fetchall()
            return [int(row[0]) for row in rows]

    def kept_in_unfinalized(self) -> list[tuple[int, int]]:
        """(batch id, message pk) still in the Parquet files of deleted, unfinalized batches."""
        with self._conn.transaction():
            rows = self._conn.execute(
                "SELECT b.batch_id, b.message_pk FROM archive_batch_message b"
                " JOIN archive_batch a ON a.id = b.batch_id"
                " WHERE a.status = 'DELETED' AND NOT a.finalized AND b.kept"
            ).fetchall()
            return [(int(row[0]), int(row[1])) for row in rows]

    def mark_finalized(self, batch_id: int) -> None:
        with self._conn.transaction():
            self._conn.execute(
                "UPDATE archive_batch SET finalized = true WHERE id = %s AND status = 'DELETED'",
                (batch_id,),
            )

    def _move(
        self, batch_id: int, from_status: str, assignments: str, params: dict[str, Any]
    ) -> None:
        """One conditional UPDATE; inside delete() it joins that transaction."""
        with self._conn.transaction():
            moved = self._conn.execute(
                f"UPDATE archive_batch SET {assignments} WHERE id = %(id)s AND status = %(from)s",
                {**params, "id": batch_id, "from": from_status},
            ).rowcount
            if moved != 1:
                raise RuntimeError(f"archive batch {batch_id} is no longer {from_status}")
