"""Priority groups of pull consumers: one group, a policy and a pin timeout per consumer,
and the pin of a pinned_client consumer's group

Revision ID: 0004_priority_groups
Revises: 0003_bridge_numbering
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

revision: str = "0004_priority_groups"
down_revision: str | None = "0003_bridge_numbering"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("consumer") as batch:
        batch.add_column(sa.Column("priority_group", sa.String(length=16), nullable=True))
        batch.add_column(
            sa.Column(
                "priority_policy", sa.String(length=16), server_default="none", nullable=False
            )
        )
        batch.add_column(sa.Column("priority_timeout_seconds", sa.Integer(), nullable=True))
    op.create_table(
        "consumer_group_state",
        sa.Column("consumer_pk", sa.BigInteger(), nullable=False),
        sa.Column("group_name", sa.String(length=16), nullable=False),
        sa.Column("pinned_id", sa.String(length=32), nullable=True),
        sa.Column("pinned_at", Timestamp(), nullable=True),
        sa.Column("last_pull_at", Timestamp(), nullable=True),
        sa.ForeignKeyConstraint(
            ["consumer_pk"],
            ["consumer.pk"],
            name=op.f("fk_consumer_group_state_consumer_pk_consumer"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("consumer_pk", name=op.f("pk_consumer_group_state")),
    )


def downgrade() -> None:
    op.drop_table("consumer_group_state")
    with op.batch_alter_table("consumer") as batch:
        batch.drop_column("priority_timeout_seconds")
        batch.drop_column("priority_policy")
        batch.drop_column("priority_group")
