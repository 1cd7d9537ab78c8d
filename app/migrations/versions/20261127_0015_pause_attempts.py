"""Paused consumers and each job's attempt history

Revision ID: 0015_pause_attempts
Revises: 0014_nats_ephemeral
Create Date: 2026-11-27

`consumer.paused_until`: claims and pushes of the consumer stop until then (NULL: running; a
time in the past: running again, as a JetStream consumer whose pause_until passed); publishes
still give it jobs. The claim statements read it in the consumer row they already select, so
it costs them no index and no plan change.

`job.attempts`: the job's last attempts (a JSON array, oldest first, trimmed to
`[ui] attempts-kept`), appended by the statements that end an attempt (ack, nak, term, lease
expiry, a push's outcome) in the UPDATE they already run; it goes with its job. jsonb on
PostgreSQL (its trim is a jsonpath slice), JSON text on SQLite. NULL: no attempt ended yet.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from app.store.types import Timestamp

revision: str = "0015_pause_attempts"
down_revision: str | None = "0014_nats_ephemeral"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("consumer") as batch:
        batch.add_column(sa.Column("paused_until", Timestamp(), nullable=True))
    with op.batch_alter_table("job") as batch:
        batch.add_column(
            sa.Column("attempts", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("attempts")
    with op.batch_alter_table("consumer") as batch:
        batch.drop_column("paused_until")
