"""Table upkeep on PostgreSQL: vacuuming the job table between autovacuum's rounds.

Every claim and ack moves a job to a status some index is partial on, so each leaves dead
index entries behind. The claim walks its index from the oldest queued job and steps over
every dead entry in front of it until a vacuum removes them: without one, claims of 100 grew
from 2.7 to 8.3 ms within a minute at 10 thousand jobs/s. Autovacuum waits for a fifth of the
table to be dead (millions of rows in a big backlog), so the sweeper vacuums sooner.
"""

from __future__ import annotations

from app.store.db import Database

# Summed over the partitions (migration 0018): the partitioned table itself holds no rows.
DEAD_JOBS = """
SELECT sum(n_dead_tup) FROM pg_stat_user_tables
WHERE relid IN (SELECT relid FROM pg_partition_tree('job'))
"""

# SKIP_LOCKED: a vacuum already running (autovacuum, another sweeper) does the work.
# INDEX_CLEANUP ON: the index entries are what this vacuum is for, and by default PostgreSQL
# leaves a big table's indexes alone when few of its pages hold dead rows.
VACUUM_JOBS = "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) job"


async def dead_jobs(db: Database) -> int:
    rows = await db.run_alone(DEAD_JOBS, {}, prepare=False)
    return int(rows[0][0]) if rows and rows[0][0] is not None else 0


async def vacuum_jobs(db: Database) -> None:
    await db.run_alone(VACUUM_JOBS, {}, prepare=False)
