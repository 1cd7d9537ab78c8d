"""The job table is partitioned by ranges of its id on PostgreSQL; job_partition keeps their state

Revision ID: 0018_job_partitions
Revises: 0017_consumer_backfill
Create Date: 2026-11-27

Finished jobs left PostgreSQL through the archive's row deletes: dead tuples for vacuum to chase
while claims walk the same indexes. A partition that holds only finished jobs is dropped whole
instead (app/store/partitions.py, docs/operations/storage.md).

The partition key is the id, not a time: acks, the claim's update, status reads and the console
find a job by its id, and PostgreSQL only prunes a look-up to one partition when the key is in
the condition (a primary key must also include the partition key, so a time key would make the
id unique per partition only). Time comes in through the sequence: each partition holds the ids
issued during one `[rdbms] partition-interval`, the sweeper moving the sequence up to the next
partition's range when the interval ends.

Nothing references job by foreign key; job's own keys to message and consumer stay, declared on
the partitioned table (each partition gets them). The count triggers move to the partitioned
table (statement triggers on it see every partition's rows, and a row moved between partitions
as an update).

The existing table becomes the first partition, job_p0, of the ids below the next multiple of
2**32 above the sequence: renamed, its indexes and keys matched to the partitioned table's (not
rebuilt), after one validating read of it (a CHECK on the id range, which lets ATTACH skip its
own scan). Writers wait for that read: about as long as a sequential scan of the table.
SQLite keeps one table; job_partition is made there too (empty) so both schemas match the models.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

revision: str = "0018_job_partitions"
down_revision: str | None = "0017_consumer_backfill"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SPAN = 1 << 32  # app/store/partitions.SPAN, repeated: a migration does not follow the code
COUNT_TRIGGERS = {
    "insert": "NEW TABLE AS new_rows",
    "delete": "OLD TABLE AS old_rows",
    "update": "OLD TABLE AS old_rows NEW TABLE AS new_rows",
}
# Indexes of job (the models' names) and their definitions after ON job.
INDEXES = {
    "ix_job_sweep": "(lease_expires_at) WHERE status = 'INFLIGHT'",
    "ix_job_consumer_status": "(consumer_pk, status, id)",
    "ix_job_message_pk": "(message_pk)",
    "ix_job_claim": "(consumer_pk, priority DESC, id) WHERE status = 'QUEUED'",
}
FOREIGN_KEYS = {
    "fk_job_message_pk_message": "(message_pk) REFERENCES message (pk) ON DELETE CASCADE",
    "fk_job_consumer_pk_consumer": "(consumer_pk) REFERENCES consumer (pk) ON DELETE CASCADE",
}


def _create_state_table() -> None:
    op.create_table(
        "job_partition",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("lower_id", sa.BigInteger(), nullable=True),
        sa.Column("upper_id", sa.BigInteger(), nullable=False),
        sa.Column("opened_at", Timestamp(), nullable=True),
        sa.Column("closed_at", Timestamp(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False, server_default="ATTACHED"),
        sa.Column("exported_rows", sa.BigInteger(), nullable=True),
        sa.Column("changed_at", Timestamp(), nullable=False),
        sa.CheckConstraint(
            "status IN ('ATTACHED', 'EXPORTED', 'DETACHED', 'DROPPED')",
            name="ck_job_partition_status",
        ),
        sa.PrimaryKeyConstraint("name", name="pk_job_partition"),
    )


def _rename_constraints(table: str, prefix: str) -> None:
    """Free the models' names for the partitioned table (indexes and constraints of `table`)."""
    bind = op.get_bind()
    constraints = bind.execute(
        sa.text("SELECT conname FROM pg_constraint WHERE conrelid = CAST(:t AS regclass)"),
        {"t": table},
    ).scalars()
    for name in list(constraints):
        op.execute(f'ALTER TABLE {table} RENAME CONSTRAINT "{name}" TO "{prefix}{name}"')
    indexes = bind.execute(
        sa.text(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = CAST(:t AS regclass)"
        ),
        {"t": table},
    ).scalars()
    for name in list(indexes):
        if not name.startswith(prefix):
            op.execute(f'ALTER INDEX "{name}" RENAME TO "{prefix}{name}"')


def _keys_and_indexes(table: str) -> None:
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_job PRIMARY KEY (id)")
    for name, definition in FOREIGN_KEYS.items():
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY {definition}")
    for name, definition in INDEXES.items():
        op.execute(f"CREATE INDEX {name} ON {table} {definition}")


def _count_triggers(table: str, create: bool) -> None:
    for op_name, tables in COUNT_TRIGGERS.items():
        function = f"job_count_{op_name}"
        if create:
            op.execute(
                f"CREATE TRIGGER {function} AFTER {op_name.upper()} ON {table}"
                f" REFERENCING {tables} FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
            )
        else:
            op.execute(f"DROP TRIGGER IF EXISTS {function} ON {table}")


def upgrade() -> None:
    _create_state_table()
    if op.get_bind().dialect.name != "postgresql":
        return
    # Publishes, claims and acks wait from here to the commit (the validating read is the
    # long part); taken first so that no writer holds a lock the steps below queue behind.
    op.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")
    position = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM job_id_seq"
            )
        )
        .scalar_one()
    )
    upper = (int(position) // SPAN + 1) * SPAN
    _count_triggers("job", create=False)
    op.execute("ALTER TABLE job RENAME TO job_p0")
    _rename_constraints("job_p0", "job_p0_")
    op.execute(
        "CREATE TABLE job (LIKE job_p0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        " PARTITION BY RANGE (id)"
    )
    # Dropping job_p0 one day must not drop the sequence every partition draws from.
    op.execute("ALTER SEQUENCE job_id_seq OWNED BY job.id")
    _keys_and_indexes("job")
    op.execute(f"ALTER TABLE job_p0 ADD CONSTRAINT job_p0_range CHECK (id < {upper}) NOT VALID")
    op.execute("ALTER TABLE job_p0 VALIDATE CONSTRAINT job_p0_range")
    op.execute(f"ALTER TABLE job ATTACH PARTITION job_p0 FOR VALUES FROM (MINVALUE) TO ({upper})")
    op.execute("ALTER TABLE job_p0 DROP CONSTRAINT job_p0_range")
    _count_triggers("job", create=True)
    op.execute(
        "INSERT INTO job_partition (name, lower_id, upper_id, opened_at, status, changed_at)"
        f" VALUES ('job_p0', NULL, {upper}, now(), 'ATTACHED', now())"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")
        op.execute(
            "CREATE TABLE job_flat (LIKE job INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            " WITH (fillfactor = 50)"
        )
        op.execute("INSERT INTO job_flat SELECT * FROM job")
        op.execute("ALTER SEQUENCE job_id_seq OWNED BY job_flat.id")
        detached = (
            op.get_bind()
            .execute(
                sa.text("SELECT name FROM job_partition WHERE status IN ('EXPORTED', 'DETACHED')")
            )
            .scalars()
        )
        names = [n for n in detached if n.startswith("job_p") and n[5:].isdigit()]
        op.execute("DROP TABLE job")
        for name in names:
            op.execute(f"DROP TABLE IF EXISTS {name}")
        op.execute("ALTER TABLE job_flat RENAME TO job")
        _keys_and_indexes("job")
        _count_triggers("job", create=True)
    op.drop_table("job_partition")
