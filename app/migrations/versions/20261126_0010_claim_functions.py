"""The claim's walk of a consumer's queue, in functions planned without a sort

Revision ID: 0010_claim_functions
Revises: 0009_job_fillfactor
Create Date: 2026-11-26

A claim takes a consumer's first due jobs in queue order (priority descending, then oldest
first), which the partial index ix_job_claim holds in that order: a walk of its first entries
that stops after the batch. PostgreSQL plans the claim from the job table's statistics,
though, and when the last ANALYZE found a consumer's queue empty it expects a row or two,
for which collecting them all through a bitmap scan and sorting them looks as cheap. A backlog
arriving after that (a burst, a consumer back from an outage) was then sorted whole on every
claim, until the next ANALYZE: at 11,000 jobs/s into an emptied queue, claims of 50 took
200-400 ms and PostgreSQL both cores (bench, push at half load, 2026-11-26).

These functions run that walk with sorting disabled (`SET enable_sort = off`), which leaves
the planner the index's own order whatever it expects, and with the generic plan kept for the
session (`plan_cache_mode = force_generic_plan`: the batch size is a parameter here, and a
generic plan priced LIMIT $n for a tenth of the table, so PostgreSQL would have planned the
walk anew on every call once the queue looked big; with no sort, the generic plan is the
walk). `claimable_jobs` locks what it returns (FOR UPDATE SKIP LOCKED) for the claim that calls
it, and tells the planner to expect a batch (ROWS 100: a set-returning function is otherwise
taken for 1,000 rows, and the claim's update then hashed the whole queue to join them);
`due_jobs_ahead` counts due jobs up to a cap, as a pull reports them.

A volatile function's query takes its own snapshot, a little newer than the claim statement's:
a job committed in between (just published, or put back to QUEUED) may be locked and counted
by `claimable_jobs` yet stay invisible to the claim's UPDATE, which then leaves it QUEUED for
the next claim (and a byte budget may be spent on it). Never claimed twice: the UPDATE checks
the status of the row it finds. FOR UPDATE needs a volatile function.

PostgreSQL only: SQLite claims through its own statements.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010_claim_functions"
down_revision: str | None = "0009_job_fillfactor"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_QUEUE_WALK = """
        FROM job
        WHERE job.consumer_pk = of_consumer AND job.status = 'QUEUED'
          AND job.earliest_next_attempt_at <= now()
        ORDER BY job.priority DESC, job.id
        LIMIT up_to"""

CLAIMABLE_JOBS = f"""
CREATE FUNCTION claimable_jobs(of_consumer bigint, up_to integer)
RETURNS TABLE (id bigint, priority integer, payload_size integer)
LANGUAGE plpgsql VOLATILE ROWS 100
SET enable_sort = off SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        SELECT job.id, job.priority, job.payload_size{_QUEUE_WALK}
        FOR UPDATE SKIP LOCKED;
END
$$"""

DUE_JOBS_AHEAD = f"""
CREATE FUNCTION due_jobs_ahead(of_consumer bigint, up_to integer) RETURNS bigint
LANGUAGE plpgsql STABLE
SET enable_sort = off SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN (SELECT count(*) FROM (SELECT 1{_QUEUE_WALK}) AS ahead);
END
$$"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(CLAIMABLE_JOBS)
        op.execute(DUE_JOBS_AHEAD)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION due_jobs_ahead(bigint, integer)")
        op.execute("DROP FUNCTION claimable_jobs(bigint, integer)")
