"""pipeline archive state: archive batches (PLANNED -> EXPORTED -> DELETED) and their messages

Revision ID: 0002_pipeline
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

revision: str = "0002_pipeline"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "archive_batch",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("cutoff", Timestamp(), nullable=False),
        sa.Column("message_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("job_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("first_message_pk", sa.BigInteger(), nullable=True),
        sa.Column("last_message_pk", sa.BigInteger(), nullable=True),
        sa.Column("deleted_message_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("deleted_job_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("kept_message_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("finalized", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("planned_at", Timestamp(), nullable=False),
        sa.Column("exported_at", Timestamp(), nullable=True),
        sa.Column("deleted_at", Timestamp(), nullable=True),
        sa.CheckConstraint(
            "status IN ('PLANNED', 'EXPORTED', 'DELETED')", name=op.f("ck_archive_batch_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_archive_batch")),
    )
    op.create_index("ix_archive_batch_status", "archive_batch", ["status"])
    op.create_table(
        "archive_batch_message",
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("message_pk", sa.BigInteger(), nullable=False),
        sa.Column("job_count", sa.Integer(), nullable=False),
        sa.Column("jobs_hash", sa.String(length=32), nullable=False),
        sa.Column("kept", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["archive_batch.id"],
            name=op.f("fk_archive_batch_message_batch_id_archive_batch"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("batch_id", "message_pk", name=op.f("pk_archive_batch_message")),
    )


def downgrade() -> None:
    op.drop_table("archive_batch_message")
    op.drop_index("ix_archive_batch_status", table_name="archive_batch")
    op.drop_table("archive_batch")
