"""Scheduled messages: when a message's jobs fall due, if later than its arrival

Revision ID: 0005_scheduled_messages
Revises: 0004_priority_groups
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

revision: str = "0005_scheduled_messages"
down_revision: str | None = "0004_priority_groups"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("message") as batch:
        batch.add_column(sa.Column("scheduled_for", Timestamp(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("message") as batch:
        batch.drop_column("scheduled_for")
