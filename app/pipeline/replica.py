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

The archive's exports (ExportReads) read the replica by a stricter rule than a staleness bound:
what an export reads must be exactly what the primary holds once the batch or partition is
settled. So each export takes the primary's WAL position after the last write that settled its
rows (a partition's jobs all delivered and counted; a batch planned and counted) and reads the
replica only once its replay has passed that position, waiting up to [pipeline] replica-wait;
a replica that does not get there, is down, or fails the export's reads leaves the export to
the primary, with a progress line saying so. Every write (the marks, the deletes, the
batch states) stays on the primary.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import psycopg

from app.config import DatabaseConfig
from app.domain.replica import ReadFrom, check_interval
from app.pipeline.db import JdbcTarget, jdbc_target
from app.pipeline.progress import Progress

T = TypeVar("T")

# Between two looks at the replica's replay position while waiting for it.
_POLL_SECONDS = 0.1


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


# -- the archive's exports ---------------------------------------------------------------------


class ExportReads:
    """Where each export's JDBC reads go, decided per export (see the module's doc)."""

    def __init__(
        self,
        database: DatabaseConfig,
        wait_seconds: float,
        progress: Progress,
        *,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        self._primary = jdbc_target(database.connection_url)
        self._replica_url = database.replica_url if database.replica is not None else ""
        self._replica = jdbc_target(self._replica_url) if self._replica_url else None
        self._wait = wait_seconds
        self._progress = progress
        self._on_wait = on_wait or (lambda what: None)
        self.read_from: Counter[str] = Counter()  # exports by where they read

    @property
    def primary(self) -> JdbcTarget:
        return self._primary

    def run(self, conn: psycopg.Connection[Any], what: str, export: Callable[[JdbcTarget], T]) -> T:
        """`export` against the replica once it holds everything `conn` (the primary) has
        committed so far, else against the primary; a replica failing it hands it over too."""
        if self._replica is None:
            self.read_from[ReadFrom.PRIMARY.value] += 1
            return export(self._primary)
        why = self._caught_up(conn, what)
        if why is None:
            try:
                result = export(self._replica)
            except Exception as exc:
                # A recovery conflict cancelling the read, the replica going down: the primary
                # holds the same rows, so the export only takes longer, never differs.
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                why = f"the replica failed its reads ({type(exc).__name__}: {first})"
            else:
                self.read_from[ReadFrom.REPLICA.value] += 1
                return result
        self._progress.line(f"{what}: reading the primary: {why}")
        self.read_from[ReadFrom.PRIMARY.value] += 1
        return export(self._primary)

    def _caught_up(self, conn: psycopg.Connection[Any], what: str) -> str | None:
        """None once the replica has replayed past the primary's current position; else why
        not (down, not a standby, still behind after the wait)."""
        # The insert position, not the written one: a job acked by an asynchronous commit is
        # already visible to the counts taken before this, while its WAL may not be written
        # yet; the walwriter writes it within a few wal_writer_delays.
        with conn.transaction():
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        target = str(row[0])
        deadline = time.monotonic() + self._wait
        told = False
        try:
            with psycopg.connect(
                self._replica_url,
                autocommit=True,
                connect_timeout=max(1, min(10, int(self._wait))),
                application_name="wb-pipeline",
            ) as replica:
                while True:
                    found = replica.execute(
                        "SELECT pg_is_in_recovery(),"
                        " pg_last_wal_replay_lsn() >= %s::pg_lsn,"
                        " pg_last_wal_replay_lsn()::text",
                        (target,),
                    ).fetchone()
                    assert found is not None
                    recovering, reached, replayed = found
                    if not recovering:
                        return "the replica is not a standby"
                    if reached:
                        if told:
                            self._progress.line(f"{what}: the replica reached {target}")
                        return None
                    if time.monotonic() >= deadline:
                        return (
                            f"the replica replayed to {replayed}, short of the primary's"
                            f" {target} after replica-wait {self._wait:g} s"
                        )
                    if not told:
                        told = True
                        self._progress.line(
                            f"{what}: waiting for the replica to replay to {target} (at {replayed})"
                        )
                        self._on_wait(what)
                    time.sleep(_POLL_SECONDS)
        except psycopg.Error as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            return f"the replica is unreachable ({type(exc).__name__}: {first})"
