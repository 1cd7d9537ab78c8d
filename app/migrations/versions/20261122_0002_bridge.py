"""NATS bridge: the delivery sequence and per-consumer delivery state

Revision ID: 0002_bridge
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

revision: str = "0002_bridge"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.schema.CreateSequence(sa.Sequence("bridge_delivery_seq")))
    op.create_table(
        "bridge_counter",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_bridge_counter")),
    )
    # The SQLite stand-in for the sequence: one row, bumped by a single UPDATE ... RETURNING.
    op.execute("INSERT INTO bridge_counter (name, value) VALUES ('delivery', 0)")
    op.create_table(
        "bridge_consumer",
        sa.Column("consumer_pk", sa.BigInteger(), nullable=False),
        sa.Column("last_delivery_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("last_stream_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("last_delivered_at", Timestamp(), nullable=True),
        sa.ForeignKeyConstraint(
            ["consumer_pk"],
            ["consumer.pk"],
            name=op.f("fk_bridge_consumer_consumer_pk_consumer"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("consumer_pk", name=op.f("pk_bridge_consumer")),
    )


def downgrade() -> None:
    op.drop_table("bridge_consumer")
    op.drop_table("bridge_counter")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.schema.DropSequence(sa.Sequence("bridge_delivery_seq")))
