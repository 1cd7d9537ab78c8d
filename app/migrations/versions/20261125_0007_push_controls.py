"""Push controls: Standard Webhooks signing secrets, per-consumer limits, push state

Revision ID: 0007_push_controls
Revises: 0006_job_counts
Create Date: 2026-11-25

A consumer's settings (its signing secret and the one it replaced, until the rotation's overlap
ends; maxInFlight; rateLimit) live on its row. What the dispatchers learn while delivering
(push disabled by a 410, the circuit breaker) lives in `push_state`, one row per consumer made
at its first failure, so a delivery never touches the row an If-Unmodified-Since guards.
Existing consumers get a secret of their own here.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

revision: str = "0007_push_controls"
down_revision: str | None = "0006_job_counts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("consumer") as batch:
        batch.add_column(sa.Column("signing_secret", sa.String(128), nullable=True))
        batch.add_column(sa.Column("previous_signing_secret", sa.String(128), nullable=True))
        batch.add_column(sa.Column("previous_secret_until", Timestamp(), nullable=True))
        batch.add_column(sa.Column("max_in_flight", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("rate_limit", sa.Float(), nullable=True))
    conn = op.get_bind()
    consumer = sa.table("consumer", sa.column("pk"), sa.column("signing_secret"))
    for (pk,) in conn.execute(sa.select(consumer.c.pk)).all():
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        conn.execute(sa.update(consumer).where(consumer.c.pk == pk).values(signing_secret=secret))
    op.create_table(
        "push_state",
        sa.Column(
            "consumer_pk",
            sa.BigInteger(),
            sa.ForeignKey(
                "consumer.pk", ondelete="CASCADE", name="fk_push_state_consumer_pk_consumer"
            ),
            nullable=False,
        ),
        sa.Column("disabled_at", Timestamp(), nullable=True),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.Column("breaker", sa.String(16), nullable=False, server_default="closed"),
        sa.Column("failures", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("trips", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("open_until", Timestamp(), nullable=True),
        sa.Column("changed_at", Timestamp(), nullable=False),
        sa.CheckConstraint(
            "breaker IN ('closed', 'open', 'half_open')", name="ck_push_state_breaker"
        ),
        sa.PrimaryKeyConstraint("consumer_pk", name="pk_push_state"),
    )


def downgrade() -> None:
    op.drop_table("push_state")
    with op.batch_alter_table("consumer") as batch:
        for column in (
            "rate_limit",
            "max_in_flight",
            "previous_secret_until",
            "previous_signing_secret",
            "signing_secret",
        ):
            batch.drop_column(column)
