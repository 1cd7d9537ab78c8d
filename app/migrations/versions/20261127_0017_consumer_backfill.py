"""Deliver policies with history: a consumer's backfill cursor and start options

Revision ID: 0017_consumer_backfill
Revises: 0016_nats_push_consumers
Create Date: 2026-11-27

A consumer made over NATS with deliver policy all, last, by_start_sequence or by_start_time
gets jobs for the channel's stored messages from its start on. The bridge copies them in
message-id order, one chunk per transaction (app/bridge/backfill.py); `backfill_next` is the
next message id to copy, NULL once the consumer is live (publishes fan out to it only then).
`opt_start_seq` / `opt_start_time` are the start the consumer was created with, reported in
its config; `mem_storage` is what it asked for (its jobs are stored as every other's). The
partial index finds the few consumers still copying without touching the others.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

revision: str = "0017_consumer_backfill"
down_revision: str | None = "0016_nats_push_consumers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("backfill_next", "opt_start_seq", "opt_start_time", "mem_storage")


def upgrade() -> None:
    with op.batch_alter_table("consumer") as batch:
        batch.add_column(sa.Column("backfill_next", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("opt_start_seq", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("opt_start_time", Timestamp(), nullable=True))
        batch.add_column(
            sa.Column("mem_storage", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.create_index(
        "ix_consumer_backfill",
        "consumer",
        ["backfill_next"],
        postgresql_where=sa.text("backfill_next IS NOT NULL"),
        sqlite_where=sa.text("backfill_next IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_consumer_backfill", table_name="consumer")
    with op.batch_alter_table("consumer") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
