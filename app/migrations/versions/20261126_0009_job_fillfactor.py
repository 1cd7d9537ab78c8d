"""The job table leaves half of each page free for its rows' next versions (fillfactor 50)

Revision ID: 0009_job_fillfactor
Revises: 0008_delivery_ledger
Create Date: 2026-11-26

A job is written three times: inserted QUEUED, then claimed and acked, each a new row version
(status is indexed, so neither update is HOT). Filled to the brim, a page has no room for the
new versions, and once some of its jobs are delivered and vacuumed, the free space PostgreSQL
hands the next inserts is scattered over pages full of long-lived delivered rows. Every claim
and ack then lands on a page nearly full, and each read of such a page prunes it again, going
over all of its rows to free the few that died: a fifth of PostgreSQL's time a job once the
table held delivered jobs (bench: 41 against 30.5 us a job; docs/performance.md, "Why the hot
paths look as they do"; the runs: bench/journal/README.md). With half of each page left free at
insert, every job's next version fits beside it, delivered rows keep to pages inserts no
longer pick, and a page is pruned once for many dead rows. The cost is room: the job table's
heap takes up to twice the space.

Only pages written from now on are filled this way. PostgreSQL only: SQLite has no fillfactor.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009_job_fillfactor"
down_revision: str | None = "0008_delivery_ledger"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_FILLFACTOR = 50


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE job SET (fillfactor = {JOB_FILLFACTOR})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE job RESET (fillfactor)")
