"""The message table is partitioned by ranges of its pk on PostgreSQL; message_key holds the
per-channel message ids; message_partition keeps the partitions' state

Revision ID: 0020_message_partitions
Revises: 0019_backfill_switch
Create Date: 2026-11-27

The message table follows the job table (0018_job_partitions): range partitions of its pk, each
the pks issued during one `[rdbms] partition-interval`, made ahead and rotated by the sweeper
with the job partitions (app/store/partitions.py). The pk is the key because messages are found
by it (the claim's join, the NATS bridge's stream sequence, the back-fill's walk) and because
a message never changes its pk: jobs and the bridge's numbering point at it.

The producer's message id was unique by `uq_message_channel_id_message_id`, and that index was
the publish's duplicate check. A partitioned table's unique keys must include the partition
key, so (channel_id, message_id) would only be unique per partition. It moves to message_key,
an unpartitioned table of (channel_id, message_id) -> message_pk: the check stays exact for as
long as the message is kept, as before, and a read by message id finds the pk there and then
one partition. Its rows go with their message (ON DELETE CASCADE on a row delete; the sweeper
deletes a partition's keys before it detaches it).

The existing table becomes message_p0 (renamed, indexes and keys matched, not rebuilt, after
one validating read); the keys are copied out of it (one read and one sorted index build), and
the foreign keys to message (job's and message_key's) are validated once each (an anti-join).
Publishes, claims and acks wait for all of it: about three sequential reads of the message
table and one of the job table.
SQLite keeps one table: message_key replaces its unique key there too, so that both dialects
run the same statements; message_partition is made there (empty) so both schemas match.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

revision: str = "0020_message_partitions"
down_revision: str | None = "0019_backfill_switch"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SPAN = 1 << 32  # app/store/partitions.SPAN, repeated: a migration does not follow the code
UNIQUE = "uq_message_channel_id_message_id"
# Indexes of message (the models' names) and their definitions after ON message.
INDEXES = {
    "ix_message_channel_id_pk": "(channel_id, pk)",
    "ix_message_scheduled": "(channel_id, scheduled_for) WHERE scheduled_for IS NOT NULL",
}
FOREIGN_KEYS = {
    "fk_message_channel_id_channel": "(channel_id) REFERENCES channel (id) ON DELETE CASCADE",
    "fk_message_producer_id_producer": "(producer_id) REFERENCES producer (id)",
}
JOB_FK = "fk_job_message_pk_message"
JOB_FK_DEFINITION = "FOREIGN KEY (message_pk) REFERENCES message (pk) ON DELETE CASCADE"
KEY_FK = "fk_message_key_message_pk_message"


def _create_state_table() -> None:
    op.create_table(
        "message_partition",
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
            name="ck_message_partition_status",
        ),
        sa.PrimaryKeyConstraint("name", name="pk_message_partition"),
    )


def _upgrade_sqlite() -> None:
    op.create_table(
        "message_key",
        sa.Column("channel_id", sa.String(255), nullable=False),
        sa.Column("message_id", sa.String(255), nullable=False),
        sa.Column("message_pk", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["message_pk"], ["message.pk"], name=KEY_FK, ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("channel_id", "message_id", name="pk_message_key"),
    )
    op.execute(
        "INSERT INTO message_key (channel_id, message_id, message_pk)"
        " SELECT channel_id, message_id, pk FROM message"
    )
    op.create_index("ix_message_key_message_pk", "message_key", ["message_pk"])
    with op.batch_alter_table("message") as batch:
        batch.drop_constraint(UNIQUE, type_="unique")


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


def _drop_keys_to_message() -> None:
    """Every foreign key that points at message, where declared (job's; and a job partition
    detached but not yet dropped keeps a copy of its own, which goes with it soon)."""
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT conrelid::regclass::text, conname FROM pg_constraint"
            " WHERE contype = 'f' AND confrelid = 'message'::regclass AND conparentid = 0"
        )
    ).all()
    for table, name in rows:
        op.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')


def _keys_and_indexes(table: str, *, unique: bool) -> None:
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_message PRIMARY KEY (pk)")
    if unique:
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {UNIQUE} UNIQUE (channel_id, message_id)")
    for name, definition in FOREIGN_KEYS.items():
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY {definition}")
    for name, definition in INDEXES.items():
        op.execute(f"CREATE INDEX {name} ON {table} {definition}")


def upgrade() -> None:
    _create_state_table()
    if op.get_bind().dialect.name != "postgresql":
        _upgrade_sqlite()
        return
    # Publishes (and, through the foreign key, claims and acks) wait from here to the commit;
    # taken first so that no writer holds a lock the steps below queue behind.
    op.execute("LOCK TABLE job, message IN ACCESS EXCLUSIVE MODE")
    position = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END"
                " FROM message_pk_seq"
            )
        )
        .scalar_one()
    )
    upper = (int(position) // SPAN + 1) * SPAN
    _drop_keys_to_message()
    op.execute("ALTER TABLE message RENAME TO message_p0")
    _rename_constraints("message_p0", "message_p0_")
    op.execute(
        "CREATE TABLE message (LIKE message_p0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        " PARTITION BY RANGE (pk)"
    )
    op.execute("ALTER SEQUENCE message_pk_seq OWNED BY message.pk")
    _keys_and_indexes("message", unique=False)
    # Copied out before the partition's unique index goes: one read, then sorted index builds.
    op.execute(
        "CREATE TABLE message_key (channel_id VARCHAR(255) NOT NULL,"
        " message_id VARCHAR(255) NOT NULL, message_pk BIGINT NOT NULL)"
    )
    op.execute(
        "INSERT INTO message_key (channel_id, message_id, message_pk)"
        " SELECT channel_id, message_id, pk FROM message_p0"
    )
    op.execute(
        "ALTER TABLE message_key ADD CONSTRAINT pk_message_key PRIMARY KEY (channel_id, message_id)"
    )
    op.execute("CREATE INDEX ix_message_key_message_pk ON message_key (message_pk)")
    op.execute(f"ALTER TABLE message_p0 DROP CONSTRAINT message_p0_{UNIQUE}")
    op.execute(
        f"ALTER TABLE message_p0 ADD CONSTRAINT message_p0_range CHECK (pk < {upper}) NOT VALID"
    )
    op.execute("ALTER TABLE message_p0 VALIDATE CONSTRAINT message_p0_range")
    op.execute(
        f"ALTER TABLE message ATTACH PARTITION message_p0 FOR VALUES FROM (MINVALUE) TO ({upper})"
    )
    op.execute("ALTER TABLE message_p0 DROP CONSTRAINT message_p0_range")
    op.execute(f"ALTER TABLE job ADD CONSTRAINT {JOB_FK} {JOB_FK_DEFINITION}")
    op.execute(
        f"ALTER TABLE message_key ADD CONSTRAINT {KEY_FK}"
        " FOREIGN KEY (message_pk) REFERENCES message (pk) ON DELETE CASCADE"
    )
    op.execute(
        "INSERT INTO message_partition (name, lower_id, upper_id, opened_at, status, changed_at)"
        f" VALUES ('message_p0', NULL, {upper}, now(), 'ATTACHED', now())"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        with op.batch_alter_table("message") as batch:
            batch.create_unique_constraint(UNIQUE, ["channel_id", "message_id"])
        op.drop_table("message_key")
        op.drop_table("message_partition")
        return
    op.execute("LOCK TABLE job, message IN ACCESS EXCLUSIVE MODE")
    op.execute("DROP TABLE message_key")
    _drop_keys_to_message()
    op.execute("CREATE TABLE message_flat (LIKE message INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    op.execute("INSERT INTO message_flat SELECT * FROM message")
    op.execute("ALTER SEQUENCE message_pk_seq OWNED BY message_flat.pk")
    detached = (
        op.get_bind()
        .execute(
            sa.text("SELECT name FROM message_partition WHERE status IN ('EXPORTED', 'DETACHED')")
        )
        .scalars()
    )
    names = [n for n in detached if n.startswith("message_p") and n[9:].isdigit()]
    op.execute("DROP TABLE message")
    for name in names:
        op.execute(f"DROP TABLE IF EXISTS {name}")
    op.execute("ALTER TABLE message_flat RENAME TO message")
    _keys_and_indexes("message", unique=True)
    op.execute(f"ALTER TABLE job ADD CONSTRAINT {JOB_FK} {JOB_FK_DEFINITION}")
    op.drop_table("message_partition")
