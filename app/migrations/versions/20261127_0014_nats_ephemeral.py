"""Ephemeral consumers, inactive thresholds and ack policy none over NATS

Revision ID: 0014_nats_ephemeral
Revises: 0013_nats_consumer_config
Create Date: 2026-11-27

A pull consumer made over NATS may be ephemeral (no durable name), may go away after
`inactive_threshold` nanoseconds without a pull request, a delivery or an ack (the sweeper
deletes it; `last_active_at` is when the bridge last saw it in use), and may acknowledge
nothing (`ack_policy` 'none': a job is DELIVERED once sent). NULL / false: a durable consumer
that acknowledges each job and never expires, as every consumer was before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

revision: str = "0014_nats_ephemeral"
down_revision: str | None = "0013_nats_consumer_config"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("ephemeral", "ack_policy", "inactive_threshold", "last_active_at")


def upgrade() -> None:
    with op.batch_alter_table("consumer") as batch:
        batch.add_column(
            sa.Column("ephemeral", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("ack_policy", sa.String(16), nullable=True))
        batch.add_column(sa.Column("inactive_threshold", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("last_active_at", Timestamp(), nullable=True))
    # The sweep's look-up: only consumers that can expire, few of them.
    op.create_index(
        "ix_consumer_inactive",
        "consumer",
        ["inactive_threshold"],
        postgresql_where=sa.text("inactive_threshold IS NOT NULL"),
        sqlite_where=sa.text("inactive_threshold IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_consumer_inactive", "consumer")
    with op.batch_alter_table("consumer") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
