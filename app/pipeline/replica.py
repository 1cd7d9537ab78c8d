"""Where the report's database reads go: [rdbms] replica-url when it is within
[rdbms] replica-max-lag, the primary otherwise, decided by the API's own routing
(app/services/reads.py: the same WAL-position measurement, the same policy in
app/domain/replica.py), not by a second copy of it.

The API measures all the time, so its choice is made before any request. A pipeline run is one
process that starts cold: it measures until the policy chooses the replica, or the replica is
proven past the limit (or down, or not a standby), which takes one or two check intervals on a
healthy replica and at most the limit plus a few intervals otherwise. Because every sample is
taken after the run holds the pipeline lock (and after its own archive step), a replica that
has reached one holds every archive change committed before the report began: the batch
states, the deleted rows and the files agree, as they do on the primary.

The report reads everything from one database, chosen once: a report mixing the primary's
batch states with a lagging replica's live rows would count a batch twice or not at all.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from app.config import DatabaseConfig
from app.domain.replica import ReadFrom, check_interval


@dataclass(frozen=True, slots=True)
class ReportSource:
    """The database the report reads, and why (a line for the run's progress)."""

    read_from: ReadFrom
    connection_url: str
    why: str
    lag_seconds: float | None = None


def report_source(database: DatabaseConfig) -> ReportSource:
    """Measure the replica (if one is configured) and choose, as the API would now."""
    if database.replica is None:
        return ReportSource(ReadFrom.PRIMARY, database.connection_url, "no replica configured")
    return asyncio.run(_measure(database))


async def _measure(database: DatabaseConfig) -> ReportSource:
    # Imported here, with a replica configured: without one the pipeline loads nothing of the
    # broker's store or services (pyproject's import contract names these three exceptions).
    from app.services.reads import CHECK_TIMEOUT_SECONDS, Reads
    from app.store.db import Database
    from app.store.replica import replica_database

    max_lag = database.replica_max_lag_seconds
    interval = check_interval(max_lag)
    lags: list[float | None] = []
    # Two statements a check: one connection each side is plenty.
    primary = Database.from_config(replace(database, pool_size=1, max_overflow=0))
    replica = replica_database(replace(database, pool_size=1, max_overflow=0))
    reads = Reads(primary, replica, max_lag, observe_lag=lags.append)
    # Past this, samples spanning the whole limit were taken and none was reached (or the
    # primary's position could not be read): the replica cannot be shown fresh enough.
    deadline = time.monotonic() + max_lag + 2 * (interval + CHECK_TIMEOUT_SECONDS)
    primary_side = ReportSource(ReadFrom.PRIMARY, database.connection_url, "")
    try:
        while True:
            await reads.check()
            lag = lags[-1] if lags else 0.0
            if reads.source() is ReadFrom.REPLICA:
                return ReportSource(
                    ReadFrom.REPLICA,
                    database.replica_url,
                    f"the replica is {lag:.3f} s behind (replica-max-lag {max_lag:g} s)",
                    lag,
                )
            if lags and lag is None:
                why = "the replica is unreachable or not a standby"
                return replace(primary_side, why=why)
            if lag is not None and lag > max_lag:
                why = f"the replica is over {lag:.3f} s behind, past replica-max-lag {max_lag:g} s"
                return replace(primary_side, why=why, lag_seconds=lag)
            if time.monotonic() > deadline:
                why = f"the replica's lag could not be measured within {max_lag:g} s"
                return replace(primary_side, why=why)
            await asyncio.sleep(interval)
    finally:
        await reads.close()
        await primary.dispose()
