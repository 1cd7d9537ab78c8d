"""Consumer settings that consumer management over NATS sets

Revision ID: 0013_nats_consumer_config
Revises: 0012_console_audit
Create Date: 2026-11-27

A pull consumer made or changed over NATS (app/services/consumer_management.py) carries the
JetStream settings the broker honours beyond its ack wait and max-ack-pending: its own
max_deliver (-1: no limit), max_waiting, a backoff (the ack wait of each delivery, seconds), a
description, metadata and its deliver policy. NULL everywhere: the broker's defaults, as every
consumer had before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_nats_consumer_config"
down_revision: str | None = "0012_console_audit"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("max_deliver", "max_waiting", "backoff", "description", "metadata", "deliver_policy")


def upgrade() -> None:
    with op.batch_alter_table("consumer") as batch:
        batch.add_column(sa.Column("max_deliver", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_waiting", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("backoff", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("description", sa.Text(), nullable=True))
        batch.add_column(sa.Column("metadata", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("deliver_policy", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("consumer") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
