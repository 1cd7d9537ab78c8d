"""Push consumers over NATS

Revision ID: 0016_nats_push_consumers
Revises: 0015_pause_attempts
Create Date: 2026-11-27

A consumer made over NATS with a deliver subject is a push consumer: the bridge delivers its
jobs to `deliver_subject` (split among the queue group `deliver_group` when set), sends idle
heartbeats every `idle_heartbeat` ns and, with `flow_control`, nats-server's flow control.
NULL deliver_subject: a pull consumer, as every consumer was before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_nats_push_consumers"
down_revision: str | None = "0015_pause_attempts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("deliver_subject", "deliver_group", "idle_heartbeat", "flow_control")


def upgrade() -> None:
    with op.batch_alter_table("consumer") as batch:
        batch.add_column(sa.Column("deliver_subject", sa.String(255), nullable=True))
        batch.add_column(sa.Column("deliver_group", sa.String(255), nullable=True))
        batch.add_column(sa.Column("idle_heartbeat", sa.BigInteger(), nullable=True))
        batch.add_column(
            sa.Column("flow_control", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("consumer") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
