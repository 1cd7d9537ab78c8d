"""A history consumer's switch to live is recorded until its racing publishes are made up

Revision ID: 0019_backfill_switch
Revises: 0018_job_partitions
Create Date: 2026-11-27

On PostgreSQL a publish can race a consumer's switch from copying its history to live: its
statement saw the consumer copying (no job fanned out) and it committed after the switch (not
copied either). The switch used to leave the make-up for those to the bridge's memory, lost when
the bridge stopped within seconds of it. It now records, in the consumer's row, when it went live
(`switched_at`), the lowest message pk such a publish can hold (`switch_from`) and the
publishes the ledger had counted before the consumer's generation then (`switch_counted`, plus
those made up since); any bridge that finds the record makes up the rest and clears it
(app/store/backfill.py). The partial index finds the few recorded switches.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.types import Timestamp

revision: str = "0019_backfill_switch"
down_revision: str | None = "0018_job_partitions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("switched_at", "switch_from", "switch_counted")


def upgrade() -> None:
    with op.batch_alter_table("consumer") as batch:
        batch.add_column(sa.Column("switched_at", Timestamp(), nullable=True))
        batch.add_column(sa.Column("switch_from", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("switch_counted", sa.BigInteger(), nullable=True))
    op.create_index(
        "ix_consumer_switched_at",
        "consumer",
        ["switched_at"],
        postgresql_where=sa.text("switched_at IS NOT NULL"),
        sqlite_where=sa.text("switched_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_consumer_switched_at", table_name="consumer")
    with op.batch_alter_table("consumer") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
