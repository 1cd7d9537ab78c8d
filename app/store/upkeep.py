"""Table upkeep on PostgreSQL: vacuuming the job table between autovacuum's rounds.

Every claim and ack moves a job to a status some index is partial on, so each leaves dead
index entries behind. The claim walks its index from the oldest queued job and steps over
every dead entry in front of it until a vacuum removes them: without one, claims of 100 grew
from 2.7 to 8.3 ms within a minute at 10 thousand jobs/s. Autovacuum waits for a fifth of the
table to be dead (millions of rows in a big backlog), so the sweeper vacuums sooner.
"""

from __future__ import annotations

from sqlalchemy import text

from app.store.db import Database
from app.store.partitions import EXISTS

# Each partition's dead row versions (migration 0018: the partitioned table itself holds no
# rows and keeps no statistics).
DEAD_JOBS = """
SELECT tree.relid::regclass::text, coalesce(stats.n_dead_tup, 0)
FROM pg_partition_tree('job') AS tree
JOIN pg_stat_user_tables AS stats ON stats.relid = tree.relid
WHERE tree.isleaf
"""

# SKIP_LOCKED: a vacuum already running (autovacuum, another sweeper) does the work.
# INDEX_CLEANUP ON: the index entries are what this vacuum is for, and by default PostgreSQL
# leaves a big table's indexes alone when few of its pages hold dead rows.
# PARALLEL 0: one process. With parallel index passes the vacuum took every core of the bench's
# machine for its index pass, and overlapped 38% of the slowest 1% of claims in a traced run
# (docs/operations/storage.md, "Vacuum").
VACUUM_OPTIONS = "SKIP_LOCKED, INDEX_CLEANUP ON, PARALLEL 0"


async def dead_jobs(db: Database) -> dict[str, int]:
    """Dead row versions of each job partition, by its name as SQL reads it."""
    rows = await db.run_alone(DEAD_JOBS, {}, prepare=False)
    return {str(name): int(dead) for name, dead in rows}


def vacuum_sql(partition: str) -> str:
    """The vacuum of one partition (its name as `dead_jobs` gives it: regclass output, so
    quoted as SQL needs it)."""
    return f"VACUUM ({VACUUM_OPTIONS}) {partition}"


async def vacuum_jobs(db: Database, partitions: list[str]) -> None:
    """Each partition in a statement of its own: one the archive's round dropped after its
    statistics were read fails alone, and is passed over (nothing is left to vacuum)."""
    for name in partitions:
        try:
            await db.run_alone(vacuum_sql(name), {}, prepare=False)
        except Exception:
            if await _exists(db, name):
                raise


async def _exists(db: Database, name: str) -> bool:
    # Only after a failed vacuum: a transaction for the partition store's own statement.
    async with db.transaction() as tx:
        return bool((await tx.conn.execute(text(EXISTS), {"name": name})).scalar_one())
