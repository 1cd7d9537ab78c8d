"""The operator console's audit log: who did what in the console, when, to how many jobs

Revision ID: 0012_console_audit
Revises: 0011_token_key
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

revision: str = "0012_console_audit"
down_revision: str | None = "0011_token_key"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "console_audit",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("at", Timestamp(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("session", sa.String(32), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("jobs", sa.BigInteger(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False, server_default=""),
        sa.PrimaryKeyConstraint("id", name="pk_console_audit"),
    )


def downgrade() -> None:
    op.drop_table("console_audit")
