"""Job counts kept by triggers (status endpoints never count rows); redrives; scheduled index

Revision ID: 0006_job_counts
Revises: 0005_scheduled_messages
Create Date: 2026-11-25

Each insert, status change and delete of a job adds its +1 / -1 to `job_count` inside the
statement that made it (a trigger), so `/job-status`, `/dlq-status` and messages-status read a
few rows per consumer however many jobs there are (bench/status.py). On PostgreSQL the trigger
is per statement (a batch claim is one upsert, not one per job) and writes to the row of its
own connection's shard, so concurrent claimers of one consumer never queue on one counter row;
a reader sums the shards. SQLite has one writer at a time and row triggers only: one shard.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision: str = "0006_job_counts"
down_revision: str | None = "0005_scheduled_messages"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SHARDS = 64  # counter rows per (consumer, status) at most on PostgreSQL

# The deltas of one statement, netted per (consumer, status) and applied in key order (so two
# connections that share a shard take their row locks in the same order).
_PG_APPLY = f"""
    INSERT INTO job_count (consumer_pk, status, shard, n)
    SELECT consumer_pk, status, pg_backend_pid() % {SHARDS}, sum(delta)
    FROM ({{deltas}}) AS d
    GROUP BY consumer_pk, status
    HAVING sum(delta) <> 0
    ORDER BY consumer_pk, status
    ON CONFLICT (consumer_pk, status, shard) DO UPDATE SET n = job_count.n + excluded.n
"""
_PG_DELTAS = {
    "insert": "SELECT consumer_pk, status, 1 AS delta FROM new_rows",
    "delete": "SELECT consumer_pk, status, -1 AS delta FROM old_rows",
    # An update whose status did not change nets to zero and writes nothing.
    "update": "SELECT consumer_pk, status, -1 AS delta FROM old_rows"
    " UNION ALL SELECT consumer_pk, status, 1 FROM new_rows",
}
_PG_TABLES = {
    "insert": "NEW TABLE AS new_rows",
    "delete": "OLD TABLE AS old_rows",
    "update": "OLD TABLE AS old_rows NEW TABLE AS new_rows",
}

_SQLITE_ADD = """
    INSERT INTO job_count (consumer_pk, status, shard, n)
    VALUES ({row}.consumer_pk, {row}.status, 0, {delta})
    ON CONFLICT (consumer_pk, status, shard) DO UPDATE SET n = n + {delta};
"""
_SQLITE_TRIGGERS = {
    "insert": ("AFTER INSERT ON job", _SQLITE_ADD.format(row="NEW", delta=1)),
    "delete": ("AFTER DELETE ON job", _SQLITE_ADD.format(row="OLD", delta=-1)),
    "update": (
        "AFTER UPDATE OF status ON job WHEN OLD.status <> NEW.status",
        _SQLITE_ADD.format(row="OLD", delta=-1) + _SQLITE_ADD.format(row="NEW", delta=1),
    ),
}


def upgrade() -> None:
    op.create_table(
        "job_count",
        sa.Column("consumer_pk", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("consumer_pk", "status", "shard", name="pk_job_count"),
    )
    _create_redrive()
    op.create_index(
        "ix_message_scheduled",
        "message",
        ["channel_id", "scheduled_for"],
        postgresql_where=sa.text("scheduled_for IS NOT NULL"),
        sqlite_where=sa.text("scheduled_for IS NOT NULL"),
    )
    if op.get_bind().dialect.name == "postgresql":
        for op_name, deltas in _PG_DELTAS.items():
            function = f"job_count_{op_name}"
            op.execute(
                f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$"
                f" BEGIN {_PG_APPLY.format(deltas=deltas)}; RETURN NULL; END $$"
            )
            op.execute(
                f"CREATE TRIGGER {function} AFTER {op_name.upper()} ON job"
                f" REFERENCING {_PG_TABLES[op_name]}"
                f" FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
            )
    else:
        for op_name, (when, body) in _SQLITE_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER job_count_{op_name} {when} BEGIN {body} END")
    # The jobs already there, counted once (writers wait: the triggers' creation locked job).
    op.execute(
        "INSERT INTO job_count (consumer_pk, status, shard, n)"
        " SELECT consumer_pk, status, 0, count(*) FROM job GROUP BY consumer_pk, status"
    )


def _create_redrive() -> None:
    op.create_table(
        "redrive",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column(
            "consumer_pk",
            sa.BigInteger(),
            sa.ForeignKey(
                "consumer.pk", ondelete="CASCADE", name="fk_redrive_consumer_pk_consumer"
            ),
            nullable=False,
        ),
        sa.Column("from_status", sa.String(16), nullable=False),
        sa.Column("changed_since", Timestamp(), nullable=True),
        sa.Column("changed_until", Timestamp(), nullable=True),
        sa.Column("per_second", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.Column("moved", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("cursor", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("upper_id", sa.BigInteger(), nullable=False),
        sa.Column("next_chunk_at", Timestamp(), nullable=False),
        sa.Column("created_at", Timestamp(), nullable=False),
        sa.Column("finished_at", Timestamp(), nullable=True),
        sa.CheckConstraint(
            "status IN ('RUNNING', 'COMPLETED', 'CANCELLED')", name="ck_redrive_status"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_redrive"),
    )
    op.create_index("ix_redrive_consumer_pk_id", "redrive", ["consumer_pk", "id"])
    op.create_index(
        "ix_redrive_due",
        "redrive",
        ["next_chunk_at"],
        postgresql_where=sa.text("status = 'RUNNING'"),
        sqlite_where=sa.text("status = 'RUNNING'"),
    )


def downgrade() -> None:
    for op_name in _PG_DELTAS:
        op.execute(
            f"DROP TRIGGER IF EXISTS job_count_{op_name}"
            + (" ON job" if op.get_bind().dialect.name == "postgresql" else "")
        )
        if op.get_bind().dialect.name == "postgresql":
            op.execute(f"DROP FUNCTION IF EXISTS job_count_{op_name}()")
    op.drop_index("ix_message_scheduled", table_name="message")
    op.drop_table("redrive")
    op.drop_table("job_count")
