"""NATS bridge: deliveries numbered per consumer, in bridge_consumer; the shared sequence and its
SQLite stand-in go

Each consumer's counter goes on from the number its last delivery had, so a consumer that
existed before keeps increasing numbers (with the gaps other consumers left), and a new one
starts at 1, as JetStream numbers.

Revision ID: 0003_bridge_numbering
Revises: 0002_bridge
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_bridge_numbering"
down_revision: str | None = "0002_bridge"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_table("bridge_counter")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.schema.DropSequence(sa.Sequence("bridge_delivery_seq")))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.schema.CreateSequence(sa.Sequence("bridge_delivery_seq")))
        # Past every number handed out, so the shared sequence never repeats one.
        op.execute(
            "SELECT setval('bridge_delivery_seq', "
            "greatest((SELECT max(last_delivery_seq) FROM bridge_consumer), 0) + 1, false)"
        )
    op.create_table(
        "bridge_counter",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_bridge_counter")),
    )
    op.execute(
        "INSERT INTO bridge_counter (name, value) "
        "SELECT 'delivery', coalesce(max(last_delivery_seq), 0) FROM bridge_consumer"
    )
