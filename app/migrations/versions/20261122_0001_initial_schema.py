"""initial schema: channels, producers, consumers, messages and delivery jobs

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _stakeholder(name: str) -> None:
    op.create_table(
        name,
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("token", sa.String(length=255), nullable=False),
        sa.Column("created_at", Timestamp(), nullable=False),
        sa.Column("updated_at", Timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{name}")),
    )


def upgrade() -> None:
    _stakeholder("channel")
    _stakeholder("producer")
    op.create_table(
        "consumer",
        sa.Column("pk", BigId, autoincrement=True, nullable=False),
        sa.Column("channel_id", sa.String(length=255), nullable=False),
        sa.Column("consumer_id", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("token", sa.String(length=255), nullable=False),
        sa.Column("callback_url", sa.Text(), server_default="", nullable=False),
        sa.Column("type", sa.String(length=8), server_default="push", nullable=False),
        sa.Column("ack_wait_seconds", sa.Integer(), nullable=True),
        sa.Column("max_ack_pending", sa.Integer(), nullable=True),
        sa.Column("created_at", Timestamp(), nullable=False),
        sa.Column("updated_at", Timestamp(), nullable=False),
        sa.ForeignKeyConstraint(
            ["channel_id"],
            ["channel.id"],
            name=op.f("fk_consumer_channel_id_channel"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pk", name=op.f("pk_consumer")),
        sa.UniqueConstraint(
            "channel_id", "consumer_id", name=op.f("uq_consumer_channel_id_consumer_id")
        ),
    )
    op.create_table(
        "message",
        sa.Column("pk", BigId, autoincrement=True, nullable=False),
        sa.Column("channel_id", sa.String(length=255), nullable=False),
        sa.Column("message_id", sa.String(length=255), nullable=False),
        sa.Column("producer_id", sa.String(length=255), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("content_type", sa.String(length=255), nullable=False),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("headers", sa.JSON(), nullable=False),
        sa.Column("received_at", Timestamp(), nullable=False),
        sa.ForeignKeyConstraint(
            ["channel_id"],
            ["channel.id"],
            name=op.f("fk_message_channel_id_channel"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["producer_id"], ["producer.id"], name=op.f("fk_message_producer_id_producer")
        ),
        sa.PrimaryKeyConstraint("pk", name=op.f("pk_message")),
        sa.UniqueConstraint(
            "channel_id", "message_id", name=op.f("uq_message_channel_id_message_id")
        ),
    )
    op.create_index("ix_message_channel_id_pk", "message", ["channel_id", "pk"])
    op.create_table(
        "job",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("message_pk", sa.BigInteger(), nullable=False),
        sa.Column("consumer_pk", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("payload_size", sa.Integer(), server_default="0", nullable=False),
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("retry_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("timeout_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("incremental_timeout", sa.Integer(), server_default="0", nullable=False),
        sa.Column("lease_expires_at", Timestamp(), nullable=True),
        sa.Column("earliest_next_attempt_at", Timestamp(), nullable=False),
        sa.Column("claimed_at", Timestamp(), nullable=True),
        sa.Column("status_changed_at", Timestamp(), nullable=False),
        sa.Column("created_at", Timestamp(), nullable=False),
        sa.Column("dead_reason", sa.Text(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["consumer_pk"],
            ["consumer.pk"],
            name=op.f("fk_job_consumer_pk_consumer"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["message_pk"],
            ["message.pk"],
            name=op.f("fk_job_message_pk_message"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job")),
    )
    queued = sa.text("status = 'QUEUED'")
    inflight = sa.text("status = 'INFLIGHT'")
    op.create_index(
        "ix_job_claim",
        "job",
        ["consumer_pk", sa.desc(sa.column("priority")), "id"],
        postgresql_where=queued,
        sqlite_where=queued,
    )
    op.create_index(
        "ix_job_sweep",
        "job",
        ["lease_expires_at"],
        postgresql_where=inflight,
        sqlite_where=inflight,
    )
    op.create_index("ix_job_consumer_status", "job", ["consumer_pk", "status", "id"])
    op.create_index("ix_job_message_pk", "job", ["message_pk"])


def downgrade() -> None:
    op.drop_table("job")
    op.drop_table("message")
    op.drop_table("consumer")
    op.drop_table("producer")
    op.drop_table("channel")
