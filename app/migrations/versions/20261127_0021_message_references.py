"""No foreign keys point at message any more: the statements that delete a message delete its
jobs and its key themselves

Revision ID: 0021_message_references
Revises: 0020_message_partitions
Create Date: 2026-11-27

Since message became a partitioned table (0020), every job a publish inserts had its foreign
key checked by a query through the partitioned parent, and that check cost the publish about a
third of its throughput: pgbench running the app's own publish (fan-out 5, 4 clients) made
20,331 jobs/s with the keys and 29,142 without them in back-to-back runs on one machine
(docs/performance.md). The key from message_key cost nothing measurable; it goes too, so that
nothing cascades from message.

What the keys did is done by the statements that change messages, each still one transaction:
- a publish writes the message, its key and its jobs in one statement, so a job always has its
  message;
- the archive's delete (app/pipeline/state.py) locks its batch's messages first, deletes only
  those no job points at, and deletes their keys in the same statement; the history copy and
  the make-up of the bridge's back-fill (app/store/backfill.py) and the re-homing of a dropped
  job partition's rows (app/store/partitions.py) take a KEY SHARE lock on each message they
  make a job for, as the foreign key's check did, so a delete and a copy of one message
  serialise as before;
- cancelling a scheduled message deletes its jobs and its key with it.

SQLite drops the same keys (its tables rebuilt by batch operations), so that both dialects run
the same statements on the same schema.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021_message_references"
down_revision: str | None = "0020_message_partitions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_FK = "fk_job_message_pk_message"
KEY_FK = "fk_message_key_message_pk_message"


@contextlib.contextmanager
def _triggers_kept(table: str) -> Iterator[None]:
    """SQLite: a batch operation rebuilds the table without its triggers (job's keep the job
    counters, app/store/counters.py), and its reflection may lose an index's WHERE clause: both
    are made again as they were, after it."""
    bind = op.get_bind()
    listed = sa.text(
        "SELECT type, name, sql FROM sqlite_master"
        " WHERE tbl_name = :t AND type IN ('trigger', 'index') AND sql IS NOT NULL"
    )
    before = {(kind, name): sql for kind, name, sql in bind.execute(listed, {"t": table})}
    yield
    after = {(kind, name): sql for kind, name, sql in bind.execute(listed, {"t": table})}
    for (kind, name), sql in before.items():
        if after.get((kind, name)) != sql:
            op.execute(f'DROP {kind.upper()} IF EXISTS "{name}"')
            op.execute(sql)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        with _triggers_kept("job"), op.batch_alter_table("job") as batch:
            batch.drop_constraint(JOB_FK, type_="foreignkey")
        with op.batch_alter_table("message_key") as batch:
            batch.drop_constraint(KEY_FK, type_="foreignkey")
        return
    # Every foreign key that points at message: job's and message_key's, and the copy of its
    # own that a job partition detached but not yet dropped keeps. Dropping a key takes an
    # ACCESS EXCLUSIVE lock on both tables (nothing is read or rewritten): all taken first, in
    # one order, so that no publish holding one of them while it waits for another deadlocks
    # with this.
    op.execute("LOCK TABLE message, message_key, job IN ACCESS EXCLUSIVE MODE")
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT conrelid::regclass::text, conname FROM pg_constraint"
            " WHERE contype = 'f' AND confrelid = 'message'::regclass AND conparentid = 0"
        )
    ).all()
    for table, name in rows:
        op.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        with op.batch_alter_table("message_key") as batch:
            batch.create_foreign_key(KEY_FK, "message", ["message_pk"], ["pk"], ondelete="CASCADE")
        with _triggers_kept("job"), op.batch_alter_table("job") as batch:
            batch.create_foreign_key(JOB_FK, "message", ["message_pk"], ["pk"], ondelete="CASCADE")
        return
    for table, name in (("message_key", KEY_FK), ("job", JOB_FK)):
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {name}"
            " FOREIGN KEY (message_pk) REFERENCES message (pk) ON DELETE CASCADE"
        )
