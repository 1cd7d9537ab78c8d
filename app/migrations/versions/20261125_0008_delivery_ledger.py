"""The delivery ledger: messages published per channel generation, jobs removed on purpose

Revision ID: 0008_delivery_ledger
Revises: 0007_push_controls
Create Date: 2026-11-25

A consumer should hold one job per message published to its channel since it was created,
less the jobs removed on purpose (a DLQ purge, a cancelled schedule, the archive). Counting
that apart from the job rows is what lets `/metrics` say when they disagree (app/store/ledger).

"Since it was created" has to agree with the publish statement's own view of the consumers,
or a publish in flight while a consumer is created would be counted for it without making its
job. So creating a consumer bumps `channel.generation` in the same transaction, the consumer
keeps the generation it was born in (`ledger_from`), and a publish counts itself under the
generation it read in the same snapshot as the consumers it fanned out to: a consumer is owed
exactly the publishes counted under its generation or later.

The counters are sharded by connection on PostgreSQL (as job_count is) so concurrent
publishers never queue on one row. Jobs already there are each consumer's opening balance:
stop the processes of older versions before migrating (compose runs `migrate` before the
rest), since they publish and delete without counting.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_delivery_ledger"
down_revision: str | None = "0007_push_controls"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # Every lock this needs, taken at once in one order before anything else: the ALTERs
        # below take channel and consumer, and writers of job must wait while the opening
        # balances are read. Taken one by one, a publish holding channel and waiting for job
        # behind this would deadlock with it.
        op.execute("LOCK TABLE channel, consumer, job IN ACCESS EXCLUSIVE MODE")
    with op.batch_alter_table("channel") as batch:
        batch.add_column(
            sa.Column("generation", sa.BigInteger(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("consumer") as batch:
        batch.add_column(
            sa.Column("ledger_from", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("ledger_opening", sa.BigInteger(), nullable=False, server_default="0")
        )
    op.create_table(
        "published_count",
        sa.Column("channel_id", sa.String(255), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("channel_id", "generation", "shard", name="pk_published_count"),
    )
    op.create_table(
        "job_removed",
        sa.Column("consumer_pk", sa.BigInteger(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("consumer_pk", "shard", name="pk_job_removed"),
    )
    op.execute(
        "UPDATE consumer SET ledger_opening = coalesce("
        "(SELECT sum(n) FROM job_count WHERE job_count.consumer_pk = consumer.pk), 0)"
    )


def downgrade() -> None:
    op.drop_table("job_removed")
    op.drop_table("published_count")
    with op.batch_alter_table("consumer") as batch:
        batch.drop_column("ledger_opening")
        batch.drop_column("ledger_from")
    with op.batch_alter_table("channel") as batch:
        batch.drop_column("generation")
